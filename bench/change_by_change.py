"""A batch judged change by change (subscriber/change_by_change.py), walked on the server and, for comparison, with
each change's statements sent from Python as before the walk.

A table ``w (id int PRIMARY KEY, u int UNIQUE, v text)`` of ``--rows`` rows on both sides; the publisher updates every
row once and one row a second time (a key changed twice on a table with another unique index: the batch is judged
one by one), then one apply (the publisher's own filtering, the job's reducer) is timed. Beside it, the same UPDATEs
with no key changed twice, applied as net effects. The tables are compared equal after each run. Not part of the
test suite.

    python bench/change_by_change.py                 # 2,000 rows
    python bench/change_by_change.py --rows 20000 --ways walk,net
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import ROOT, load_average  # noqa: E402  (bench/apply.py: the shared helpers; puts this checkout on the path)

sys.path.insert(0, str(ROOT))
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.flows.apply.drain import apply  # noqa: E402
from airflow_provider_rowfilter.flows.refresh import refresh  # noqa: E402
from airflow_provider_rowfilter.subscriber import apply_target, change_by_change  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

TABLE = "CREATE TABLE w (id int PRIMARY KEY, u int UNIQUE, v text)"
ROWS = "SELECT w::text FROM w ORDER BY id"


def run(cluster: LocalPostgres, way: str, rows: int, directory: Path) -> float:
    pub, sub = cluster.create_database(f"cbc_pub_{way}"), cluster.create_database(f"cbc_sub_{way}")
    fill = f"INSERT INTO w SELECT i, i, 'r' FROM generate_series(1, {rows}) i"
    for dsn in (pub, sub):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute(fill)
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION pw FOR TABLE w")
    spec = SubscriptionSpec(subscription=f"cbc_{way}", publisher=pub, subscriber=sub, publications=("pw",),
                            copy_data=False, change_log=str(directory / way), filtering="source")
    refresh(spec)
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("UPDATE w SET v = 'x' || id")
        if way != "net":
            conn.execute("UPDATE w SET v = 'y' WHERE id = 1")
    walk = apply_target.walk
    if way == "python":  # every phase through apply_target.py's statements, as before the walk
        apply_target.walk = lambda table, phase, last, counts: phase
    limit = change_by_change.ONE_BY_ONE_LIMIT
    change_by_change.ONE_BY_ONE_LIMIT = 10**9
    try:
        began = time.monotonic()
        apply(spec, max_changes=10**7)
        took = time.monotonic() - began
    finally:
        apply_target.walk, change_by_change.ONE_BY_ONE_LIMIT = walk, limit
    with psycopg.connect(pub) as a, psycopg.connect(sub) as b:
        assert a.execute(ROWS).fetchall() == b.execute(ROWS).fetchall(), way
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--ways", default="walk,python,net", help="walk (the server-side walk), python (each change's "
                   "statements from Python), net (no key changed twice: net effects)")
    args = p.parse_args(argv)
    with LocalPostgres.start() as cluster, tempfile.TemporaryDirectory(prefix="rowfilter-bench-cbc-") as directory:
        for way in args.ways.split(","):
            took = run(cluster, way, args.rows, Path(directory))
            changes = args.rows + (way != "net")
            print(f"{way}: {changes:,} UPDATEs applied in {took:.2f} s ({took / changes * 1000:.3f} ms a change); "
                  f"load average {load_average()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
