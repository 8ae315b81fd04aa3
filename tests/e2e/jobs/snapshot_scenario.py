"""The snapshot tests' scenario: two filtered tables on a publisher, an empty subscriber, a spec file.

Shared by test_snapshot, test_resync and test_status; the ``setup`` fixture in tests/e2e/jobs/conftest.py
builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import yaml

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions
from tests.e2e.jobs.databases import names

PUBLISHER = """
CREATE TABLE t1 (id int PRIMARY KEY, region text, v int);
INSERT INTO t1 SELECT g, (ARRAY['NSW', 'VIC'])[1 + g % 2], g FROM generate_series(1, 1000) g;
CREATE TABLE t2 (id int PRIMARY KEY, v text);
INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 20) g;
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (id > 50), t2 WHERE (id % 2 = 0);
"""
T1 = "CREATE TABLE t1 (id int PRIMARY KEY, region text, v int);"
T2 = "CREATE TABLE t2 (id int PRIMARY KEY, v text);"
SPLIT = CopyOptions(max_partitions=3, min_pages=1)

#: Rows enough for a second page of ``t1 (a int, b int, c text)``, so that SPLIT_SNAPSHOT splits it.
T1_SECOND_PAGE = "INSERT INTO t1 SELECT g, g, (ARRAY['NSW', 'QLD'])[1 + g % 2] FROM generate_series(1000, 1400) g"

#: ``python -c SPLIT_SNAPSHOT <spec file or spec JSON>``: the snapshot job as a process, every table of two
#: pages or more read by two readers, so that its copy runs as Spark tasks (a table this small is otherwise copied by one reader,
#: from the job's own process, without Spark). Prints the job's JSON summary; exits as the job does.
SPLIT_SNAPSHOT = """
import json, sys
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.jobs.exit_status import fail, run_job
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, sync_tables
def body():
    arg = sys.argv[1]
    spec = SubscriptionSpec.from_json(arg) if arg.lstrip().startswith("{") else SubscriptionSpec.load(arg)
    result = sync_tables(spec, options=CopyOptions(max_partitions=2, min_pages=1))
    print(json.dumps(result.summary()))
    return 0 if result.ok else fail(result.error())
sys.exit(run_job(body))
"""


def make_setup(fresh_db: Callable[[], str], tmp_path: Path) -> tuple[SubscriptionSpec, str]:
    """The publisher built, the subscriber empty; the spec and its file's path."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(PUBLISHER)
    spec = SubscriptionSpec(subscription=f"snap_{next(names)}",
                            publisher=pub, subscriber=sub, publications=("p1",))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"subscription": spec.subscription, "publisher": pub, "subscriber": sub,
                                    "publications": ["p1"]}))
    return spec, str(path)


def execute(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text)


def published(spec: SubscriptionSpec, table: str) -> list[str]:
    """What the copy must produce: the publisher's rows passing the table's filter, in text form."""
    where = {"t1": "id > 50", "t2": "id % 2 = 0"}[table]
    with psycopg.connect(spec.publisher) as conn:
        return sorted(r[0] for r in conn.execute(f"SELECT x::text FROM {table} x WHERE {where}"))
