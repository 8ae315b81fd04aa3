"""The per-table sync state machine of ``pg_subscription_rel`` (pg_subscription_rel.h, tablesync.c)."""

from __future__ import annotations

import enum

from airflow_provider_rowfilter.core.errors import RowFilterError


class SyncState(str, enum.Enum):
    """``srsubstate``: i init, d data is being copied, f finished table copy, s synchronized, r ready."""

    INIT = "i"
    DATA_COPY = "d"
    FINISHED_COPY = "f"
    SYNCHRONIZED = "s"
    READY = "r"

    @property
    def label(self) -> str:
        return {"i": "init", "d": "data copy", "f": "finished copy", "s": "synchronized", "r": "ready"}[self.value]


_ORDER = [SyncState.INIT, SyncState.DATA_COPY, SyncState.FINISHED_COPY, SyncState.SYNCHRONIZED, SyncState.READY]

# Forward moves only; a copy interrupted in `d` is redone from `d` (tablesync restarts the copy).
ALLOWED = {
    SyncState.INIT: {SyncState.DATA_COPY},
    SyncState.DATA_COPY: {SyncState.DATA_COPY, SyncState.FINISHED_COPY},
    SyncState.FINISHED_COPY: {SyncState.SYNCHRONIZED, SyncState.READY},
    SyncState.SYNCHRONIZED: {SyncState.READY},
    SyncState.READY: set(),
}


class StateTransitionError(RowFilterError):
    """A table's state would move backwards or skip a step."""


def check_transition(table: str, current: SyncState, new: SyncState, *, resync: bool = False) -> None:
    """Raise unless ``current`` → ``new`` is a move PostgreSQL's state machine makes.

    Only an explicit resync sends a table back to ``i`` (the backfill path).
    """
    if resync and new is SyncState.INIT:
        return
    if new not in ALLOWED[current]:
        raise StateTransitionError(
            f"table {table} cannot go from state {current.value!r} ({current.label}) to {new.value!r} ({new.label})",
            table=table,
            hint="states only move forward (i → d → f → s → r); use `rowfilter resync --table` to copy a table again",
        )


def at_least(state: SyncState, target: SyncState) -> bool:
    """Whether ``state`` has reached ``target`` in the i → d → f → s → r order."""
    return _ORDER.index(state) >= _ORDER.index(target)
