"""The publisher's side of ``rowfilter status``: the slot, what may invalidate it, and the standbys' readiness.

Read now, once per status; when the publisher cannot be reached, status still prints the subscriber's
side (:attr:`PublisherView.unreachable`). What is warned about and what makes the subscription
broken (exit 3) is decided here (:func:`findings`), from what PostgreSQL records: a slot missing while
tables hold positions read from it, or invalidated (``invalidation_reason``, core/slot_retention.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.slot_retention import WAY_BACK, Retention, invalidation, schedule_risks
from airflow_provider_rowfilter.core.spec.schedule import longest_gap
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.humane import duration, size
from airflow_provider_rowfilter.publisher.readiness import Readiness, readiness, spec_standbys
from airflow_provider_rowfilter.publisher.slot_health import SlotHealth, read_retention, read_slot
from airflow_provider_rowfilter.publisher.standby import check_capture_source


@dataclass
class PublisherView:
    """What status reads on the publisher; ``slot`` None (with ``unreachable``) when it cannot be reached."""

    current: int | None = None
    slot: SlotHealth | None = None
    unreachable: str | None = None
    filtering: str | None = None  # the mode the next capture takes (core/spec/subscription.py), or why it refuses
    retention: Retention | None = None
    standbys: list[Readiness] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # a standby as the publisher: what it lacks


def publisher_view(spec: SubscriptionSpec, slot_name: str, copied: Sequence[tuple[str, str]] = ()) -> PublisherView:
    """Read the publisher's side now; ``copied``: the tables in ``f`` and their positions (readiness)."""
    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            current, slot = read_slot(pub, slot_name)
            version = pub.info.server_version
            retention = read_retention(pub)
            view = PublisherView(parse_lsn(current), slot, retention=retention)
            try:
                view.filtering = spec.filtering_mode(version)
                view.warnings = check_capture_source(pub, view.filtering)
            except RowFilterError as e:
                view.filtering = view.filtering or f"refused: {e.message}"
                view.warnings = [e.message]
            view.standbys = readiness(pub, slot_name, spec_standbys(spec), copied) if spec.standbys else []
    except RowFilterError as e:
        unreachable = e.message + (f" ({e.detail})" if e.detail else "")
        # The standbys are read all the same: while the primary is down, whether one can be promoted with the
        # slot, or was promoted already, is what matters most.
        standbys = readiness(None, slot_name, spec_standbys(spec), copied, unreachable=unreachable) \
            if spec.standbys else []
        return PublisherView(unreachable=unreachable, standbys=standbys)
    return view


def findings(spec: SubscriptionSpec, view: PublisherView, past: Sequence[str]) -> tuple[list[str], str | None]:
    """What status warns about, and why the subscription is broken (None when it is not).

    :param past: the tables past ``i`` (their positions came from the slot).
    """
    slot = view.slot
    if slot is None:
        promoted = [r.standby for r in view.standbys if r.role == "promoted"]
        then = (f"; standby {', '.join(promoted)} was promoted: point the spec's publisher at it (or list both servers "
                "in one URL with target_session_attrs=read-write)" if promoted else
                "; when it is down for good, promote a failover-ready standby and point the publisher at it "
                "(docs/failover.md, \"After a promotion\")" if view.standbys else "")
        return [f"{view.unreachable}: the publisher cannot be reached, so the replication slot's state is unknown and "
                f"lag was not measured (the slot itself is not known to be lost){then}"], None
    name = f'replication slot "{slot.name}"'
    if not slot.exists:
        if not past:
            return [f"{name} does not exist on the publisher; `rowfilter refresh` creates it"], None
        return [], (f"{name} does not exist on the publisher, but {', '.join(past)} "
                    f"{'is' if len(past) == 1 else 'are'} past the initial copy: the changes since "
                    f"{'its position' if len(past) == 1 else 'their positions'} are lost to this subscription. "
                    "Copy them again: see `rowfilter refresh --help`")
    if slot.lost:
        cause, fix = invalidation(slot.invalidated or "wal_removed", view.retention, slot.inactive_since)
        return [], (f"{name} was invalidated by the publisher ({slot.invalidated}): {cause}; the changes since the "
                    f"tables' positions cannot be read from it. To keep it from happening again: {fix}. "
                    f"{WAY_BACK[0].upper()}{WAY_BACK[1:]}")
    warnings = list(view.warnings)
    if slot.wal_status == "unreserved":
        warnings.append(f"{name} holds more WAL than max_slot_wal_keep_size allows (wal_status unreserved): "
                        "the next checkpoint on the publisher removes it and invalidates the slot; run the apply "
                        "now, or raise max_slot_wal_keep_size")
    threshold = spec.retained_wal_warning_bytes
    if slot.retained_bytes is not None and slot.retained_bytes > threshold:
        warnings.append(f"{name} retains {size(slot.retained_bytes)} of WAL on the publisher, more than "
                        f"retained_wal_warning ({size(threshold)}): is the subscription's apply running? "
                        "A subscription you no longer need: `rowfilter drop`")
    if view.retention is not None:
        warnings += schedule_risks(view.retention, longest_gap(spec.apply_schedule), spec.apply_schedule)
    for standby in view.standbys:
        if not standby.ready and not standby.is_publisher:
            warnings.append(f"standby {standby.standby} is not ready to take over the slot: "
                            + "; ".join(standby.problems))
    return warnings, None


def slot_line(name: str, view: PublisherView) -> str:
    """One line on the slot: its WAL, whether a session reads it, failover, since when it is idle."""
    slot = view.slot
    if slot is None:
        return f"slot {name}: unknown (the publisher cannot be reached)"
    if not slot.exists:
        return f"slot {name}: missing on the publisher"
    parts = [f"wal_status {slot.wal_status or 'n/a'}",
             "retains " + ("nothing" if slot.retained_bytes is None else size(slot.retained_bytes)) + " of WAL now",
             "active" if slot.active else "inactive"]
    if slot.safe_wal_size is not None:
        parts.append(f"{size(max(slot.safe_wal_size, 0))} more before max_slot_wal_keep_size")
    if view.retention is not None and view.retention.idle_timeout is not None and slot.inactive_since is not None \
            and not slot.active:
        parts.append(f"idle since {slot.inactive_since:%Y-%m-%d %H:%M:%S %Z} (idle_replication_slot_timeout "
                     f"{duration(view.retention.idle_timeout)})")
    if slot.failover is not None:
        parts.append("failover slot" if slot.failover else "not a failover slot")
    if slot.synced:
        parts.append("synchronized from a primary (synced)")
    return f"slot {name}: " + ", ".join(parts)


def readiness_lines(view: PublisherView) -> list[str]:
    """One line per standby of the spec: ready to take over the slot, or what is wrong."""
    return [f"standby {r.standby}: {r.summary()}" for r in view.standbys]
