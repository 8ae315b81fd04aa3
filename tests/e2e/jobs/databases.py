"""The databases of the job tests: a publisher, our subscriber and a native subscriber, side by side.

Shared by the job tests (and the Spark and Airflow tests that run the same scenarios); the ``dbs``
fixture in tests/e2e/jobs/conftest.py makes one per test.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from airflow_provider_rowfilter.core.spec.conninfo import PASSWORD_ENV
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, TableSyncResult, sync_tables
from airflow_provider_rowfilter.tooling.native import NativeSubscription, table_rows
from tests.roles import PasswordRole

names = itertools.count(1)  # unique subscription names within the run
#: Who evaluates the publications (core/spec/subscription.py): the differential and fault tests run in both modes.
FILTERING_MODES = ("source", "spark")
#: Who evaluates the publications and who reduces the batch: the publisher, then the job's own process
#: (flows/apply/net_effect.py); the publisher, then Spark (a batch over IN_PROCESS_BATCH_CHANGES); Spark both.
APPLY_PATHS = ("source", "source-reduced-by-spark", "spark")


def apply_path(monkeypatch, path: str) -> tuple[str, Counter]:
    """The spec's ``filtering`` for ``path`` (one of :data:`APPLY_PATHS`), and a count of the batches each
    engine reduces (``process``, ``spark``) as the test goes on."""
    from airflow_provider_rowfilter.flows.apply import reducers
    from airflow_provider_rowfilter.spark import apply_frames

    if path == "source-reduced-by-spark":
        monkeypatch.setattr(reducers, "IN_PROCESS_BATCH_CHANGES", -1)
        monkeypatch.setattr(reducers, "COLUMNS_BATCH_CHANGES", -1)
    engines: Counter = Counter()

    def counted(engine: str, function):
        def run(*args, **kwargs):
            engines[engine] += 1
            return function(*args, **kwargs)
        return run
    monkeypatch.setattr(reducers, "reduce_batch", counted("process", reducers.reduce_batch))
    monkeypatch.setattr(apply_frames, "decide", counted("spark", apply_frames.decide))
    return ("spark" if path == "spark" else "source"), engines

# --- the documentation's row-filter example (logical-replication.sgml), with a few more rows ------
ROW_FILTER_TABLES = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
"""
ROW_FILTER_PUBLISHER = ROW_FILTER_TABLES + """
-- p2 filters t2 on e, outside t2's key: PostgreSQL accepts that and fails the first UPDATE of t2;
-- we refuse it up front, so the referee's table gets the identity that makes it valid.
ALTER TABLE t2 REPLICA IDENTITY FULL;
INSERT INTO t1 VALUES (2, 102, 'NSW'), (3, 103, 'QLD'), (4, 104, 'VIC'), (5, 105, 'ACT'), (6, 106, 'NSW'),
                      (7, 107, 'NT'), (8, 108, 'QLD'), (9, 109, 'NSW'), (10, NULL, 'NSW'), (11, 111, 'nsw');
INSERT INTO t2 VALUES (1, 99, 1), (2, 98, 2), (10, 1, 3), (11, NULL, 4), (12, 99, NULL);
INSERT INTO t3 VALUES (1, 1, 1), (10, 10, 10), (11, NULL, NULL);
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
CREATE PUBLICATION p2 FOR TABLE t1, t2 WHERE (e = 99);
CREATE PUBLICATION p3 FOR TABLE t2 WHERE (d = 10), t3 WHERE (g = 10);
"""

@dataclass
class Databases:
    publisher: str
    native: str
    ours: str
    natives: list[NativeSubscription] = field(default_factory=list)

    def create(self, publisher_sql: str, subscriber_sql: str) -> None:
        for dsn, text in ((self.publisher, publisher_sql), (self.native, subscriber_sql), (self.ours, subscriber_sql)):
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(text)

    def subscribe_native(self, publications: tuple[str, ...]) -> NativeSubscription:
        native = NativeSubscription(self.publisher, self.native, f"nat_{next(names)}", publications)
        self.natives.append(native)
        return native.create()

    change_logs: Path | None = None
    #: The URLs the specs made here connect with: the superuser's (the cluster's password file), or the
    #: password roles' after :meth:`authenticate_as`.
    spec_urls: tuple[str, str] | None = None

    def authenticate_as(self, roles: Mapping[str, PasswordRole], monkeypatch) -> None:
        """Specs made from now on connect as the password roles, their passwords in the environment as a user
        gives them (``ROWFILTER_PUBLISHER_PASSWORD``, ``ROWFILTER_SUBSCRIBER_PASSWORD``); the test's own
        statements, the native referee and the checks stay the superuser's."""
        self.spec_urls = (roles["publisher"].url(self.publisher), roles["subscriber"].url(self.ours))
        for role, env in PASSWORD_ENV.items():
            monkeypatch.setenv(env, roles[role].password)

    @property
    def spec_publisher(self) -> str:
        return self.publisher if self.spec_urls is None else self.spec_urls[0]

    @property
    def spec_ours(self) -> str:
        return self.ours if self.spec_urls is None else self.spec_urls[1]

    def spec(self, publications: tuple[str, ...], name: str, filtering: str = "auto") -> SubscriptionSpec:
        change_log = None if self.change_logs is None else str(self.change_logs / name)
        return SubscriptionSpec(subscription=name, publisher=self.spec_publisher, subscriber=self.spec_ours,
                                publications=publications, change_log=change_log, filtering=filtering)

    def assert_same(self, tables: tuple[str, ...]) -> None:
        for table in tables:
            assert table_rows(self.ours, table) == table_rows(self.native, table), f"table {table} differs"


def run_ours(spec: SubscriptionSpec, spark, options: CopyOptions | None = None) -> TableSyncResult:
    refresh(spec)
    result = sync_tables(spec, spark=spark, options=options)
    assert result.ok, result.summary()
    return result


