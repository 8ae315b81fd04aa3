"""One word per subscription for the Replication page: ok, lagging or broken, with the reasons.

Pure: it judges what the page read (the state, the slot, the last run of the incremental sync),
so the rules are in one place and tested without a database. The verdicts, worst first:

- ``broken``: something a person must fix before changes flow again: the spec file is invalid, the
  subscriber cannot be read, the subscription records an error (a conflict), the incremental sync's
  last run failed, the slot is gone while tables are past their copy, or it was invalidated;
- ``at risk``: the publisher is about to invalidate the slot (half of ``idle_replication_slot_timeout`` idle, or
  half of ``max_slot_wal_keep_size`` used, or ``wal_status`` unreserved: core/slot_retention.py ``exposures``),
  with the time left;
- ``lagging``: changes flow, late: the last batch is older than ``max_batch_age`` (the spec's
  ``airflow.max_batch_age``, else three intervals of the incremental sync's schedule), the slot holds
  more WAL than the threshold (``airflow.max_retained_wal``, else the spec's ``retained_wal_warning``) or
  is ``unreserved``, or tables are still in their initial sync, or the incremental sync has had a run in
  ``running`` for longer than its interval, or the watch DAG's last lag check failed (its reasons);
- ``paused``: the incremental-sync DAG is paused: nothing applies, the slot guard keeps the slot read (the
  time left before the publisher would invalidate it is said while nobody reads it);
- ``disabled`` (``rowfilter disable``), ``dropped`` (``DROP SUBSCRIPTION``), ``new`` (no state yet: the
  initial sync has not run): said as such, each with its reason;
- ``ok``: none of the above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_provider_rowfilter.core.spec.schedule import LATE_INTERVALS
from airflow_provider_rowfilter.humane import duration, size

VERDICTS = ("broken", "at_risk", "lagging", "paused", "disabled", "dropped", "new", "ok")


@dataclass(frozen=True)
class Facts:
    """What the page knows of one subscription, for :func:`judge`."""

    spec_error: str | None = None
    read_error: str | None = None
    exists: bool = True
    dropped_at: str | None = None
    enabled: bool = True
    last_error: str | None = None
    failed_run: str | None = None  # "run <id> of <dag> failed at <time>" when the incremental sync's last run failed
    batch_age: float | None = None  # seconds since the newest batch; None: no batch yet
    max_batch_age: float | None = None
    schedule_interval: float | None = None  # seconds between two runs of the incremental sync
    slot_exists: bool | None = None  # None: the publisher was not read
    slot_lost: bool = False
    wal_status: str | None = None
    retained_bytes: int | None = None
    max_retained_bytes: int | None = None
    past_copy: Sequence[str] = ()  # tables in d, f, s or r
    syncing: Sequence[str] = ()  # tables not yet in r, as "public.t1 (d)"
    #: the incremental-sync DAG is paused (its id), and the publisher's limits counting down on the slot now
    #: (core/slot_retention.py ``Exposure.as_dict``)
    paused_dag: str | None = None
    exposures: Sequence[dict] = ()
    #: "run … of … has been running for 12 min, more than its interval (5 min)"
    overdue_run: str | None = None
    #: the problems of the watch DAG's last lag check, when it failed
    check_failed: Sequence[str] = ()


@dataclass(frozen=True)
class Health:
    verdict: str
    reasons: list[str] = field(default_factory=list)


def judge(f: Facts) -> Health:
    """The verdict and its reasons, the worst first (see the module)."""
    if f.spec_error:
        return Health("broken", [f"invalid spec file: {f.spec_error}"])
    if f.read_error:
        return Health("broken", [f"cannot read the subscriber: {f.read_error}"])
    if not f.exists:
        if f.dropped_at:
            return Health("dropped", [f"dropped at {f.dropped_at} (DROP SUBSCRIPTION); remove its spec file, or run "
                                      "its initial sync to subscribe again"])
        return Health("new", ["not subscribed yet: run its initial-sync DAG"])
    broken: list[str] = []
    if f.last_error:
        broken.append(f"last error: {f.last_error.strip().splitlines()[0]}")
    if f.failed_run:
        broken.append(f.failed_run)
    if f.slot_exists is False and f.past_copy:
        broken.append(f"its replication slot does not exist on the publisher, but {', '.join(f.past_copy)} "
                      f"{'is' if len(f.past_copy) == 1 else 'are'} past the initial copy")
    if f.slot_lost:
        broken.append("its replication slot was invalidated (wal_status lost)")
    if broken:
        return Health("broken", broken)
    counting = [f"its slot would be {e['said']}" for e in f.exposures]
    risky = [f"its slot would be {e['said']}" for e in f.exposures if e.get("at_risk")]
    lagging = _lagging(f)
    paused = _paused(f)
    if risky:
        return Health("at_risk", risky + paused + lagging)
    if not f.enabled:
        return Health("disabled", ["disabled (ALTER SUBSCRIPTION … DISABLE): nothing is applied until "
                                   "`rowfilter enable`; the slot keeps the changes"] + counting)
    if paused:  # the cause of any lateness, said first
        return Health("paused", paused + counting + lagging)
    if lagging:
        return Health("lagging", lagging + counting)
    return Health("ok", [])


def _paused(f: Facts) -> list[str]:
    if not f.paused_dag:
        return []
    return [f"paused: its incremental sync {f.paused_dag} is paused, nothing is applied until it is unpaused; the "
            "watch DAG's slot guard keeps the slot read meanwhile"]


def _lagging(f: Facts) -> list[str]:
    lagging: list[str] = []
    limit = f.max_batch_age or (LATE_INTERVALS * f.schedule_interval if f.schedule_interval else None)
    if limit is not None and f.past_copy and f.enabled:
        if f.batch_age is None:
            lagging.append("no batch applied yet")
        elif f.batch_age > limit:
            why = ("max_batch_age" if f.max_batch_age else
                   f"{LATE_INTERVALS} intervals of its schedule, {duration(f.schedule_interval or 0)} each")
            lagging.append(f"last batch {duration(f.batch_age)} ago, more than {duration(limit)} ({why})")
    if f.wal_status == "unreserved":
        lagging.append("its slot holds more WAL than max_slot_wal_keep_size (wal_status unreserved): the next "
                       "checkpoint invalidates it")
    if f.retained_bytes is not None and f.max_retained_bytes is not None and f.retained_bytes > f.max_retained_bytes:
        lagging.append(f"its slot retains {size(f.retained_bytes)} of WAL, more than {size(f.max_retained_bytes)}")
    if f.syncing:
        lagging.append(f"initial sync: {', '.join(f.syncing)}")
    if f.overdue_run:
        lagging.append(f.overdue_run)
    lagging += [f"the watch's lag check failed: {p}" for p in f.check_failed]
    return lagging
