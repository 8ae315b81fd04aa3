"""SyncSequences: move the subscriber's sequences past the publisher's (``rowfilter sync-sequences``).

Run in process by the CLI and SyncSequencesOperator's task (never spark-submitted: no Spark is involved);
jobs/sync_sequences.py is its ``python -m`` entry point.

PostgreSQL's logical replication does not replicate sequence data (the Restrictions of its logical
replication chapter: "if, however, some kind of switchover or failover to the subscriber database is
intended, then the sequences would need to be updated to the latest values, either by copying the
current data from the publisher (perhaps using pg_dump) or by determining a sufficiently high value
from the tables themselves"). For each subscribed table (or the ``tables`` given), every sequence one
of its columns owns on the publisher is matched with the sequence the same column owns on the
subscriber, and the subscriber's is moved so that its next value comes after the publisher's last
(``setval(seq, publisher_last_value, true)``; for a descending sequence, below it). A sequence already
past is left alone, so running it again changes nothing; ``dry_run`` says what it would do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.publisher.sequences import OwnedSequence, owned_sequences
from airflow_provider_rowfilter.subscriber.sequences import set_past
from airflow_provider_rowfilter.subscriber.state import StateError, StateStore

log = logging.getLogger(__name__)

#: What was done to one sequence (``action``).
SET, WOULD_SET, PAST, UNUSED, NO_SEQUENCE, UNREADABLE = (
    "set", "would set", "already past", "never used on the publisher", "no sequence owned on the subscriber",
    "not readable on the publisher")


@dataclass
class SequenceSync:
    """One publisher sequence and the subscriber's of the same column."""

    table: str
    column: str
    publisher_sequence: str
    publisher_last_value: int | None
    subscriber_sequence: str | None
    before: int | None  # the subscriber's next value before
    after: int | None  # the subscriber's next value after (as it would be, for a dry run)
    action: str


@dataclass
class SequencesResult:
    subscription: str
    dry_run: bool
    sequences: list[SequenceSync] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(s.action == SET for s in self.sequences)

    def summary(self) -> dict:
        return {**asdict(self), "changed": self.changed}


def sync_sequences(spec: SubscriptionSpec, tables: Sequence[TableName] | None = None, *,
                   dry_run: bool = False) -> SequencesResult:
    """Move every sequence the subscribed ``tables`` (default all) own on the subscriber past the publisher's.

    :raises StateError: a table given that is not the subscription's.
    :raises SequenceSyncError: a sequence that cannot take the value (its bounds, a privilege); the ones
        before it in the list were moved.
    """
    result = SequencesResult(spec.subscription, dry_run)
    with connect(spec.subscriber, "subscriber", spec) as sub:
        store = StateStore(sub, spec.subscription)
        store.require_subscription()
        rels = store.tables()
        known = [r.table for r in rels]
        if tables is not None:
            unknown = [t for t in tables if t not in known]
            if unknown:
                raise StateError(f"table {unknown[0]} is not part of subscription {spec.subscription!r}",
                                 table=str(unknown[0]), hint=f"its tables are {', '.join(map(str, known)) or 'none'}")
        chosen = list(dict.fromkeys(tables)) if tables is not None else known
        with connect(spec.publisher, "publisher", spec) as pub:
            theirs = owned_sequences(pub, chosen)
        ours = owned_sequences(sub, chosen)
        for (table, column), source in theirs.items():
            entry = _plan(source, ours.get((table, column)))
            if entry.action == WOULD_SET and not dry_run:
                set_past(sub, entry.subscriber_sequence, source.last_value, table=str(table), column=column)
                entry.action = SET
            result.sequences.append(entry)
            log.info("%s.%s: %s %s (publisher %s at %s)", table, column, entry.subscriber_sequence or "-",
                     entry.action, source.sequence, source.last_value)
    return result


def _plan(source: OwnedSequence, target: OwnedSequence | None) -> SequenceSync:
    """What to do with ``target`` so that its next value comes after ``source``'s last (before, for descending)."""
    entry = SequenceSync(str(source.table), source.column, source.sequence, source.last_value,
                         None if target is None else target.sequence, None if target is None else target.next_value,
                         None if target is None else target.next_value, WOULD_SET)
    if target is None:
        entry.action = NO_SEQUENCE
    elif not source.readable:
        entry.action = UNREADABLE
    elif source.last_value is None:
        entry.action = UNUSED
    elif (target.next_value > source.last_value) if target.increment > 0 else (target.next_value < source.last_value):
        entry.action = PAST
    else:
        entry.after = source.last_value + target.increment
    return entry

