"""Which change log a subscriber is fed from, and what it needs of it: the subscriber's state
(subscriber/state.py) records and reads these, the capture (publisher/capture.py) checks the log
against them. Apart from change_log/log.py so that the state store loads without pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogIdentity:
    """Which change log, and where it was read: what ``rowfilter.subscription`` records of it."""

    id: str
    host: str
    path: str

    @property
    def location(self) -> str:
        return f"{self.host}:{self.path}"


@dataclass(frozen=True)
class LogNeeds:
    """What a subscriber needs of the change log, read from its state (subscriber/state.py ``StateStore.log_needs``).

    :param since: the lowest position of its tables in ``f``, ``s``, ``r``: every transaction
        committed past it must be in the log. None when no table needs anything yet (all in ``i``,
        ``d``, or none).
    :param tables: those tables (qualified names) with their positions, to name the affected ones.
    :param recorded: the log the subscriber was fed from, None before the first.
    """

    subscription: str
    since: int | None
    tables: tuple[tuple[str, int], ...] = ()
    recorded: LogIdentity | None = None


@dataclass(frozen=True)
class ServerOrigin:
    """Which server a capture read (each segment's metadata, ``publisher``): its cluster's system identifier
    and, on a primary, its timeline (publisher/failover.py ``check_lineage``)."""

    system_identifier: str
    timeline: int | None  # None on a standby (it follows its primary's history)

    def as_dict(self) -> dict:
        return {"system_identifier": self.system_identifier, "timeline": self.timeline}

    @classmethod
    def from_dict(cls, doc: dict | None) -> ServerOrigin | None:
        if not isinstance(doc, dict) or "system_identifier" not in doc:
            return None
        return cls(str(doc["system_identifier"]), doc.get("timeline"))
