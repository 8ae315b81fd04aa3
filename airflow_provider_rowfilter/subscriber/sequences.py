"""Move a subscriber sequence past a value (``setval``), as ``rowfilter sync-sequences`` decides (flows/sync_sequences.py).

``setval(seq, v, true)`` makes the next ``nextval`` return ``v + increment``. It is not transactional
(PostgreSQL's sequence functions), which does not matter here: moving a sequence forward twice to the
same value is the same as once.
"""

from __future__ import annotations

import psycopg

from airflow_provider_rowfilter.connection import primary_message
from airflow_provider_rowfilter.core.errors import RowFilterError


class SequenceSyncError(RowFilterError):
    """A subscriber sequence cannot be moved past the publisher's value."""


def set_past(conn: psycopg.Connection, sequence: str, value: int, *, table: str, column: str) -> None:
    """``setval(sequence, value, true)``: the next value the subscriber hands out comes after ``value``."""
    try:
        conn.execute("SELECT setval(%s::regclass, %s, true)", (sequence, value))
    except psycopg.Error as e:
        raise SequenceSyncError(f"cannot set sequence {sequence} to {value}: {primary_message(e)}", table=table,
                                detail=f"the publisher's sequence of column {column} is at {value}",
                                hint=f"widen the subscriber's sequence (ALTER SEQUENCE {sequence} MAXVALUE …/AS bigint) "
                                "or grant UPDATE on it to the subscriber's role, then run again") from e
