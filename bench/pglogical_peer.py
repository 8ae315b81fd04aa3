"""pglogical 2 as a benchmark peer: the cluster it needs and a subscription with our scenario's row filters.

pglogical is not a dependency of the product or of CI: it is the other PostgreSQL-to-PostgreSQL
replication users compare us with. Debian ships it for its PostgreSQL (``apt-get install postgresql-15
postgresql-15-pglogical``), so the clusters of a benchmark with ``--pglogical`` run that server
(``--bin-dir``, default ``/usr/lib/postgresql/15/bin``) with ``shared_preload_libraries = pglogical``.

The subscription carries the scenario's publications as replication sets with the same row filters
(``pglogical.replication_set_add_table(…, row_filter := …)``), the history's set insert-only as its
publication is; its slot, like the native one, is on the publisher, and it is caught up when that
slot's ``confirmed_flush_lsn`` reaches a target (``wait_confirmed``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg

from airflow_provider_rowfilter.tooling.embedded import LocalPostgres

DEFAULT_BIN_DIR = Path("/usr/lib/postgresql/15/bin")
#: (replication set, table, row filter or None, insert only)
SETS = (
    ("bench", "pgbench_accounts", "aid % 10 < 5", False),
    ("bench", "pgbench_tellers", "tid % 2 = 0", False),
    ("bench", "pgbench_branches", None, False),
    ("bench_history", "pgbench_history", "aid % 10 < 5", True),
)


def start_cluster(bin_dir: Path = DEFAULT_BIN_DIR, *, track_commit_timestamp: bool = False) -> tuple[LocalPostgres, Path]:
    """A throwaway cluster of ``bin_dir``'s PostgreSQL with pglogical preloaded; returns it and its data
    directory (the caller removes it after ``stop()``: a cluster started on a given directory keeps it).

    ``track_commit_timestamp`` is off unless asked: pglogical needs it only for its last/first-update-wins
    resolutions (the subscription keeps the default, apply_remote), and with it on our subscriber does PostgreSQL
    18's origin conflict detection (every row the initial copy wrote is an ``update_origin_differs`` at its first
    UPDATE), which neither native PostgreSQL 15 nor pglogical does."""
    if not (bin_dir.parent / "lib" / "pglogical.so").exists():
        raise SystemExit(f"pglogical is not installed beside {bin_dir}: apt-get install postgresql-15-pglogical "
                         "(or pass --bin-dir of a PostgreSQL that has it)")
    data = Path(tempfile.mkdtemp(prefix="rowfilter-bench-pglogical-")) / "data"
    cluster = LocalPostgres.start(data, bin_dir=bin_dir)
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pglogical'")
        if track_commit_timestamp:
            conn.execute("ALTER SYSTEM SET track_commit_timestamp = on")
    cluster.stop()
    return LocalPostgres.start(data, bin_dir=bin_dir), data.parent


def remove(data_parent: Path) -> None:
    shutil.rmtree(data_parent, ignore_errors=True)


class PglogicalSubscription:
    """A pglogical node on each side and one subscription to the scenario's replication sets."""

    def __init__(self, publisher: str, subscriber: str, name: str) -> None:
        self.publisher, self.subscriber, self.name = publisher, subscriber, name

    def create(self, *, timeout: float = 3600) -> PglogicalSubscription:
        """Nodes, sets, the subscription with its initial copy; returns once the copy is done."""
        with psycopg.connect(self.publisher, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pglogical")
            conn.execute("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (self.publisher,))
            for name in dict.fromkeys(s[0] for s in SETS):
                insert_only = next(s[3] for s in SETS if s[0] == name)
                conn.execute("SELECT pglogical.create_replication_set(%s, replicate_insert := true, "
                             "replicate_update := %s, replicate_delete := %s, replicate_truncate := %s)",
                             (name, not insert_only, not insert_only, not insert_only))
            for set_name, table, row_filter, _ in SETS:
                conn.execute("SELECT pglogical.replication_set_add_table(%s, %s::regclass, synchronize_data := true, "
                             "row_filter := %s)", (set_name, table, row_filter))
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pglogical")
            conn.execute("SELECT pglogical.create_node(node_name := 'subscriber', dsn := %s)", (self.subscriber,))
            conn.execute("SELECT pglogical.create_subscription(subscription_name := %s, provider_dsn := %s, "
                         "replication_sets := %s, synchronize_structure := false, synchronize_data := true, "
                         "forward_origins := '{}')", (self.name, self.publisher, list(dict.fromkeys(s[0] for s in SETS))))
            began = time.monotonic()
            deadline = began + timeout
            while True:
                status = conn.execute("SELECT status FROM pglogical.show_subscription_status(%s)",
                                      (self.name,)).fetchone()[0]
                pending = conn.execute("SELECT count(*) FROM pglogical.local_sync_status WHERE sync_status <> 'r'"
                                       ).fetchone()[0]
                if status == "replicating" and not pending:
                    break
                # "down" until its apply worker has started; down for long, it failed (the server log says why)
                if (status == "down" and time.monotonic() - began > 60) or time.monotonic() > deadline:
                    raise SystemExit(f"pglogical subscription {self.name}: {status}, {pending} tables not synced")
                time.sleep(0.2)
        return self

    @property
    def slot(self) -> str:
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            return conn.execute("SELECT slot_name FROM pglogical.show_subscription_status(%s)",
                                (self.name,)).fetchone()[0]

    def set_enabled(self, enabled: bool) -> None:
        slot = self.slot
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            conn.execute(f"SELECT pglogical.alter_subscription_{'enable' if enabled else 'disable'}(%s, true)",
                         (self.name,))
        if not enabled:  # wait for the apply worker to leave (the slot is released)
            with psycopg.connect(self.publisher, autocommit=True) as conn:
                deadline = time.monotonic() + 60
                while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"slot {slot} still active after disabling {self.name}")
                    time.sleep(0.05)

    def drop(self) -> None:
        with psycopg.connect(self.subscriber, autocommit=True) as conn:
            conn.execute("SELECT pglogical.drop_subscription(%s, true)", (self.name,))
