"""One writer per change log, held by the database every worker reaches, not by a file system.

A capture (and ``rowfilter drop``, which moves the log aside) holds a session advisory lock keyed by the
subscription, ``(hashtext('rowfilter-capture:<subscription>'), hashtext('change_log'))``, in the
subscriber (in the publisher for a spec without one), on a session of its own, for as long as it
writes: the same rule for every location of the log, a local directory or a bucket, since object
storage has no ``flock`` and two Airflow workers or pods share no disk. The lock lives as long as the
session: a worker that vanishes releases it when the server notices the dead connection, which this
session asks to be soon (``tcp_keepalives_*`` and ``tcp_user_timeout``, settings any role may set;
PostgreSQL's ``pq_setkeepalivesidle`` in src/backend/libpq/pqcomm.c). Before the segment is
published and before the slot moves, the capture checks the session is still there
(:meth:`WriterLock.check`): a writer that lost its lock stops before it changes anything durable.

A connection pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) cannot hold a
session lock: point the subscriber at the server or a session-mode pool (docs/change-log.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

#: How soon the server drops a vanished writer's session, and its lock (seconds): idle, then 3 probes 10 s apart.
#: (tcp_user_timeout is PostgreSQL 12+: set where the server has it.)
_KEEPALIVE = """SELECT set_config(name, value, false) FROM (VALUES ('tcp_keepalives_idle', '30'),
                    ('tcp_keepalives_interval', '10'), ('tcp_keepalives_count', '3'), ('tcp_user_timeout', '60000'))
                    AS s(name, value) WHERE name IN (SELECT name FROM pg_settings)"""


def writer_lock_key(subscription: str) -> tuple[str, str]:
    """The two text keys (each hashed with ``hashtext``) of the capture's lock of ``subscription``."""
    return f"rowfilter-capture:{subscription}", "change_log"


@dataclass
class WriterLock:
    """The held lock: the session that holds it, and where (``subscriber`` or ``publisher``)."""

    conn: psycopg.Connection
    where: str
    subscription: str

    def check(self) -> None:
        """Raise when the session that holds the lock is gone (another writer may hold it now)."""
        try:
            self.conn.execute("SELECT 1")
        except psycopg.Error as e:
            raise ChangeLogError(
                f"the capture of subscription {self.subscription!r} lost its writer lock: the session in the "
                f"{self.where} that held it ended ({type(e).__name__})",
                detail="nothing was published or advanced by this capture; another capture may hold the log now",
                hint="run the capture again; the slot is where it was") from e


def holders(conn: psycopg.Connection, subscription: str) -> str:
    """PIDs of the other sessions holding the capture's lock of ``subscription`` in this database."""
    rows = conn.execute(
        """SELECT DISTINCT pid FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND pid <> pg_backend_pid()
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND classid = hashtext(%s)::oid AND objid = hashtext(%s)::oid
           ORDER BY pid""", writer_lock_key(subscription)).fetchall()
    return ", ".join(str(pid) for (pid,) in rows)


@contextmanager
def writer_lock_on(conn: psycopg.Connection, subscription: str, where: str) -> Iterator[WriterLock]:
    """Hold the capture's lock of ``subscription`` on the session ``conn`` (left open); raise when another holds it.

    :raises ChangeLogError: another capture (or ``rowfilter drop``) holds it, naming its PID.
    """
    key = writer_lock_key(subscription)
    if not conn.execute("SELECT pg_try_advisory_lock(hashtext(%s), hashtext(%s))", key).fetchone()[0]:
        pid = holders(conn, subscription)
        raise ChangeLogError(
            f"another capture of subscription {subscription!r} holds its change log (PID {pid or '?'} in the {where})",
            hint="let it finish; captures of one subscription run one at a time, wherever they run")
    try:
        yield WriterLock(conn, where, subscription)
    finally:
        if not conn.broken and not conn.closed:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s), hashtext(%s))", key)


@contextmanager
def writer_lock(spec: SubscriptionSpec) -> Iterator[WriterLock]:
    """Hold the capture's lock of ``spec``'s subscription on a session of its own, in the subscriber (or the
    publisher for a spec without a subscriber).

    :raises ChangeLogError: another capture holds it.
    """
    where = "subscriber" if spec.subscriber else "publisher"
    with connect(getattr(spec, where), where, spec) as conn:
        conn.execute(_KEEPALIVE)
        with writer_lock_on(conn, spec.subscription, where) as held:
            yield held
