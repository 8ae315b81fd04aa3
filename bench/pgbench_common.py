"""The pgbench scenario of bench/drain.py and bench/keepup.py: the publisher filled by ``pgbench -i`` and
published with row filters (:data:`PUBLICATIONS`), the subscriber's empty tables, our subscription copied
and caught up by ``rowfilter`` processes, and the options both benchmarks take."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apply import (  # noqa: E402  (bench/apply.py: the shared helpers; puts this checkout on the path)
    CLI,
    ROOT,
    SPARK_CONF,
    current_lsn,
    drain_processes,
    write_spec,
)

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec  # noqa: E402
from airflow_provider_rowfilter.publisher.capture_objects import capture_names  # noqa: E402
from airflow_provider_rowfilter.spark import connect_server  # noqa: E402
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres  # noqa: E402

PGBENCH = os.environ.get("PGBENCH", "/usr/bin/pgbench")
ACCOUNTS_FILTER = "aid % 10 < 5"
TELLERS_FILTER = "tid % 2 = 0"
HISTORY_FILTER = "aid % 10 < 5"  # the history of the published accounts, at any scale
PUBLICATIONS = {
    "bench": f"CREATE PUBLICATION bench FOR TABLE pgbench_accounts WHERE ({ACCOUNTS_FILTER}), "
             f"pgbench_tellers WHERE ({TELLERS_FILTER}), pgbench_branches",
    "bench_history": f"CREATE PUBLICATION bench_history FOR TABLE pgbench_history WHERE ({HISTORY_FILTER}) "
                     "WITH (publish = 'insert')",
}


# --- pgbench ------------------------------------------------------------------------------------------
def pgbench_env(cluster: LocalPostgres, database: str) -> dict[str, str]:
    """pgbench's connection in libpq's environment variables, never on its command line; timestamps in UTC."""
    return {**os.environ, "PGHOST": cluster.host, "PGPORT": str(cluster.port), "PGUSER": cluster.user,
            "PGDATABASE": database, "PGTZ": "UTC", "PGPASSFILE": str(cluster.passfile)}


def pgbench(cluster: LocalPostgres, database: str, *args: str) -> str:
    """Run pgbench to the end; its whole output (it reports on stdout and progress on stderr)."""
    done = subprocess.run([PGBENCH, *args], env=pgbench_env(cluster, database), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pgbench {' '.join(args)} on {database} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout + done.stderr


def pgbench_figures(output: str) -> dict:
    """Transactions and tps from pgbench's report, and its ``-P`` progress lines."""
    txns = re.search(r"number of transactions actually processed: (\d+)", output)
    tps = re.search(r"tps = ([\d.]+)", output)
    progress = [{"second": float(s), "tps": float(t)}
                for s, t in re.findall(r"progress: ([\d.]+) s, ([\d.]+) tps", output)]
    return {"transactions": int(txns.group(1)) if txns else None, "tps": float(tps.group(1)) if tps else None,
            "progress": progress}


def server_version(cluster: LocalPostgres) -> str:
    return f"{cluster.version_num // 10000}.{cluster.version_num % 10000}"


def publisher_setup(cluster: LocalPostgres, database: str, scale: int) -> float:
    """``pgbench -i`` (tables, data, VACUUM, primary keys) and the publications; returns seconds."""
    began = time.monotonic()
    pgbench(cluster, database, "-i", "-q", "-s", str(scale))
    with psycopg.connect(cluster.dsn(database), autocommit=True) as conn:
        for statement in PUBLICATIONS.values():
            conn.execute(statement)
    return time.monotonic() - began


def subscriber_setup(cluster: LocalPostgres, database: str) -> None:
    """The same tables and primary keys (pgbench's own DDL: ``-I dtp``), empty."""
    pgbench(cluster, database, "-i", "-q", "-I", "dtp")


# --- the two sides ------------------------------------------------------------------------------------
def cli(spec_file: Path, command: str, *extra: str) -> float:
    """One ``rowfilter <command> --spec …`` process; returns its wall time."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", CLI, command, "--spec", str(spec_file), *extra],
                          cwd=str(spec_file.parent), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))})
    if done.returncode:
        raise SystemExit(f"rowfilter {command} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return time.monotonic() - began


def setup_ours(pub: str, target: str, name: str, workdir: Path, conf: dict[str, str],
               remote: str | None = None, change_log: str | None = None, filtering: str | None = None
               ) -> tuple[Path, str, float]:
    """refresh, snapshot, then apply runs until caught up (tables in r); returns (spec file, slot, seconds).

    ``remote``: the jobs are clients of this Spark Connect server (only SQL settings are a client's).
    ``change_log``: where the log lives (default ``<workdir>/changes``; an ``s3://`` URL for bench/drain.py --s3).
    ``filtering``: the spec's (``spark``: Spark judges every batch; default the spec's own).
    """
    spark_conf = {**SPARK_CONF, **conf}
    if remote:
        spark_conf = {k: v for k, v in spark_conf.items() if k.startswith("spark.sql.")}
    spec = SubscriptionSpec(subscription=name, publisher=pub, subscriber=target, publications=tuple(PUBLICATIONS),
                            change_log=change_log or str(workdir / "changes"), spark_conf=spark_conf,
                            spark_remote=remote, **({"filtering": filtering} if filtering else {}))
    spec_file = write_spec(spec, workdir)
    slot = capture_names(name)[0]
    began = time.monotonic()
    cli(spec_file, "refresh")
    cli(spec_file, "snapshot")
    drain_processes(spec_file, pub, slot, current_lsn(pub))
    return spec_file, slot, time.monotonic() - began


def decoder() -> str:
    """How our processes decode the stream: ``native`` (the C extension) or ``numpy`` (publisher/pgoutput_columns.py)."""
    done = subprocess.run([sys.executable, "-c", "from airflow_provider_rowfilter.publisher.pgoutput_columns "
                           "import DECODER; print(DECODER)"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


# --- the options both take ----------------------------------------------------------------------------
def pgbench_arguments(p: argparse.ArgumentParser) -> None:
    """The publisher's size and pgbench's clients."""
    p.add_argument("--scale", type=int, default=10, help="pgbench -i -s (default 10: 1,000,000 accounts)")
    p.add_argument("--clients", type=int, default=4, help="pgbench -c (default 4)")
    p.add_argument("--threads", type=int, default=2, help="pgbench -j (default 2)")


def apply_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """How our runs go (``rowfilter apply`` options, the spec's spark_conf) and the result file ``docs/bench/<out>``."""
    p.add_argument("--max-changes", type=int, help="rowfilter apply --max-changes (default: the CLI's)")
    p.add_argument("--time-budget", type=float, help="rowfilter apply --time-budget (draining runs only)")
    p.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting in our spec's spark_conf (repeatable)")
    p.add_argument("--spark-connect", action="store_true",
                   help="our jobs as clients of a local Spark Connect server started for the run (local[2])")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / out, help="JSON result file")


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options (``--conf`` as a mapping); our warnings on stderr."""
    args = p.parse_args(argv)
    args.conf = dict(args.conf)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args


def apply_flags(args: argparse.Namespace) -> list[str]:
    """``--max-changes`` and ``--time-budget`` of every ``rowfilter apply`` run, when given."""
    return [*(["--max-changes", str(args.max_changes)] if args.max_changes else []),
            *(["--time-budget", str(args.time_budget)] if args.time_budget else [])]


@contextlib.contextmanager
def spark_server(enabled: bool, workdir: Path) -> Iterator[str | None]:
    """A local Spark Connect server for our jobs (``--spark-connect``), its URL; None without it."""
    if not enabled:
        yield None
        return
    state = workdir / "spark-server"
    began = time.monotonic()
    server = connect_server.start(state, port=15436, master="local[2]", conf=SPARK_CONF)
    print(f"Spark Connect server {server.url} started in {time.monotonic() - began:.1f} s", flush=True)
    try:
        yield server.url
    finally:
        connect_server.stop(state)


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value
