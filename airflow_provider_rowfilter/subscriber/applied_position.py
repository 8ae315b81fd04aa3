"""Read-your-writes: whether every table of a subscription holds what the publisher had committed through an LSN.

A table holds every change committed on the publisher through ``X`` when its recorded position is at or past
``X`` in a state whose position says so: ``r`` (the applied position: a batch moves every ready table to the
batch's end, apply/batch_transaction.py ``_move``), ``s``, and ``f`` (the copy is consistent with its snapshot
at ``lsn``, which holds every transaction committed before it). ``i`` and ``d`` (a copy, or a reconcile, under
way) hold nothing yet. This is what PostgreSQL answers on a standby with ``pg_last_wal_replay_lsn() >= X``
(and PostgreSQL 19's ``WAIT FOR LSN``), asked of a logical subscription table by table, as
``pg_subscription_rel.srsublsn`` records it.

The judge is one pure function, :func:`check_applied`, that the command (``rowfilter wait``), the sensor and its
trigger share (hooks read the state through :mod:`~airflow_provider_rowfilter.subscriber.state_reader`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.subscriber.state_reader import StateReading

#: The states whose ``lsn`` says the table holds everything committed before it.
HOLDS_THROUGH_LSN = (SyncState.FINISHED_COPY, SyncState.SYNCHRONIZED, SyncState.READY)


@dataclass(frozen=True)
class AppliedProgress:
    """How far the tables are from ``lsn``: done, still behind (with why), or failed for good (``error``)."""

    lsn: str
    done: bool
    #: table -> its state and position, ``"r 0/1F00F48"``
    positions: dict[str, str] = field(default_factory=dict)
    behind: tuple[str, ...] = ()
    error: str | None = None
    #: the subscription is disabled (``rowfilter disable``): nothing moves until it is enabled
    disabled: bool = False

    def waiting_text(self) -> str:
        """``public.t1 (r at 0/1A), public.t2 (i)``: the tables still behind, what the waits log."""
        return ", ".join(f"{t} ({self.positions[t]})" for t in self.behind)

    def as_dict(self) -> dict[str, object]:
        return {"lsn": self.lsn, "done": self.done, "tables": self.positions, "behind": list(self.behind),
                "error": self.error, "disabled": self.disabled}


def check_applied(reading: StateReading, lsn: str) -> AppliedProgress:
    """Judge a reading: done when every table of the subscription holds the publisher's changes through ``lsn``.

    A recorded error (of the subscription or a table) fails at once, as the relation sensor does: waiting cannot
    fix it. A disabled subscription keeps waiting, and says so.
    """
    target = parse_lsn(lsn)
    text = format_lsn(target)
    name = reading.subscription
    if reading.row is None:
        return AppliedProgress(text, False, error=f"subscription {name!r} has no state in the subscriber (no row in "
                               f"rowfilter.subscription); run `rowfilter refresh` (RefreshPublicationOperator) for it "
                               f"first, or check the subscription and the subscriber")
    positions = {str(r.table): r.state.value + ("" if r.lsn is None else f" at {r.lsn}") for r in reading.tables}
    if reading.row.last_error:
        return AppliedProgress(text, False, positions, error=f"subscription {name!r} stopped with an error: "
                               f"{reading.row.last_error}")
    failed = [f"{r.table}: {r.last_error}" for r in reading.tables if r.last_error]
    if failed:
        return AppliedProgress(text, False, positions, error=f"subscription {name!r}, table {'; '.join(failed)}")
    behind = tuple(str(r.table) for r in reading.tables
                   if r.state not in HOLDS_THROUGH_LSN or r.lsn is None or parse_lsn(r.lsn) < target)
    return AppliedProgress(text, not behind, positions, behind, disabled=not reading.row.enabled)
