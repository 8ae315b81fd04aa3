"""What the publisher had committed at a time, as a WAL position a wait can compare (``rowfilter wait --at``).

A transaction is visible once its commit record is in the WAL (``RecordTransactionCommit`` in
src/backend/access/transam/xact.c inserts it before ``ProcArrayEndTransaction`` makes it visible), so everything
committed when the publisher's clock reads T ends at or before ``pg_current_wal_insert_lsn()`` read at T. The
position is exact for a T not past yet: we wait until the publisher's own clock reaches T, then read it.

PostgreSQL keeps no map from a past time back to a WAL position: the commit timestamp (pgoutput's Commit message,
``pg_xact_commit_timestamp``) is taken before the commit record is inserted, so commits are not in timestamp order
in the WAL, and no prefix of the WAL is "everything committed by T". For a past T the position read now is used:
it holds everything committed by T and what came since, so the wait never ends early, it may end later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import pendulum
import psycopg

from airflow_provider_rowfilter.core.errors import SpecError

#: The position of the last WAL record inserted (a standby: the last replayed; it is what can be decoded there).
WAL_INSERTED = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END)"


@dataclass(frozen=True)
class CommittedPosition:
    """The WAL position that holds everything the publisher had committed at ``at`` (``read_at``: when it was read)."""

    lsn: str
    at: datetime
    read_at: datetime
    #: ``at`` was not past when asked: the position was read when the publisher's clock reached it
    exact: bool


def parse_at(value: str | datetime) -> datetime | None:
    """A wait's ``at``: ``now`` (None), an ISO 8601 time with its zone, or a datetime (pendulum reads the text)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise SpecError(f"at={value!r} has no time zone", hint="give the time with its zone, e.g. 2026-12-02T09:00Z")
        return value
    text = str(value).strip()
    if text.lower() == "now":
        return None
    try:
        parsed = pendulum.parse(text, exact=False)
    except (ValueError, pendulum.parsing.exceptions.ParserError) as e:
        raise SpecError(f"{text!r} is not a time: {e}",
                        hint="give an ISO 8601 time with its zone, e.g. 2026-12-02T09:00:00Z, or now") from None
    if not isinstance(parsed, datetime):
        raise SpecError(f"{text!r} is not a time of day", hint="give a date and a time, e.g. 2026-12-02T09:00:00Z")
    if not any(c in text[10:] for c in "Z+-") and "UTC" not in text:
        raise SpecError(f"{text!r} has no time zone", hint="give the time with its zone, e.g. 2026-12-02T09:00:00Z")
    return parsed


def committed_position(conn: psycopg.Connection, at: datetime | None = None, *,
                       deadline: float | None = None) -> CommittedPosition:
    """The position through which the publisher had committed everything at ``at`` (None: now).

    A future ``at`` is waited for on the publisher's clock (``clock_timestamp()``), until ``deadline`` (a
    ``time.monotonic()`` value) at the latest: :class:`TimeoutError` past it.
    """
    waited = False
    while True:
        lsn, now = conn.execute(f"SELECT {WAL_INSERTED}::text, clock_timestamp()").fetchone()
        if at is None or now >= at:
            _flushed(conn, lsn)
            return CommittedPosition(lsn, at or now, now, exact=at is None or waited)
        waited = True
        left = (at - now).total_seconds()
        if deadline is not None and time.monotonic() + left > deadline:
            raise TimeoutError(f"the publisher's clock reads {now.isoformat(timespec='seconds')}, "
                               f"{left:.0f} s before {at.isoformat(timespec='seconds')}")
        time.sleep(min(left, 1.0))


def _flushed(conn: psycopg.Connection, lsn: str, most: float = 5.0) -> None:
    """Wait (``wal_writer_delay``, 200 ms by default, at most ``most`` seconds) until the WAL through ``lsn`` is
    flushed: logical decoding reads only flushed WAL, and a capture that finds nothing more to read moves the slot
    to the flushed end (publisher/capture.py), so the next capture then reaches ``lsn`` even if nothing commits."""
    ends = time.monotonic() + most
    while time.monotonic() < ends:
        if conn.execute("SELECT pg_is_in_recovery() OR pg_current_wal_flush_lsn() >= %s::pg_lsn",
                        (lsn,)).fetchone()[0]:
            return
        time.sleep(0.05)
