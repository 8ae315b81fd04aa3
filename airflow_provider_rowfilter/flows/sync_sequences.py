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

A sequence that cannot be synchronized (the publisher's not readable by its role, the subscriber's
refusing ``setval``, a subscriber sequence whose column owns none on the publisher any more) is
reported with its fix and the others are still synchronized; the result is then not ``ok``, and
every entry point exits 1 (fails the task) after saying what was done.

When one of the subscription's publications is ``FOR ALL SEQUENCES`` (PostgreSQL 19; in a publications file, for a
publisher of any version), the list is what it publishes instead: every permanent sequence of the publisher's
database, owned by a column or not, matched with the subscriber's sequence of the same name, as PostgreSQL 19's
sequence synchronization lists and matches them (publisher/sequences.py). Its values are moved past, as above.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from airflow_provider_rowfilter.connection import connect, one
from airflow_provider_rowfilter.core.publication.ddl import publications_from_ddl
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.publisher.catalog_reader import read_catalog
from airflow_provider_rowfilter.publisher.sequences import (
    OwnedSequence,
    all_sequences_published,
    named_sequences,
    owned_sequences,
    publishable_sequences,
)
from airflow_provider_rowfilter.subscriber import conflicts
from airflow_provider_rowfilter.subscriber.sequences import SequenceSyncError, set_past
from airflow_provider_rowfilter.subscriber.state import StateError, StateStore

log = logging.getLogger(__name__)

#: What was done to one sequence (``action``).
SET, WOULD_SET, PAST, UNUSED, NO_SEQUENCE, UNREADABLE, FAILED, NO_SOURCE = (
    "set", "would set", "already past", "never used on the publisher", "no sequence owned on the subscriber",
    "not readable on the publisher", "failed", "no sequence owned on the publisher")
#: A sequence a FOR ALL SEQUENCES publication publishes that the subscriber has none of (PostgreSQL 19 would not
#: synchronize it either): said, not a failure.
NO_NAMESAKE = "no sequence of that name on the subscriber"
#: The actions that leave a subscriber sequence that needed moving where it was: the run fails (exit 1).
PROBLEMS = (UNREADABLE, FAILED, NO_SOURCE)


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
    error: str | None = None  # why it could not be synchronized (an action of PROBLEMS), with the fix


@dataclass
class SequencesResult:
    subscription: str
    dry_run: bool
    sequences: list[SequenceSync] = field(default_factory=list)
    #: the sequences a FOR ALL SEQUENCES publication publishes (PostgreSQL 19), when one of the subscription's is one;
    #: None: the subscribed tables' own sequences, as before 19
    published: list[str] | None = None

    @property
    def changed(self) -> int:
        return sum(s.action == SET for s in self.sequences)

    @property
    def failed(self) -> list[SequenceSync]:
        return [s for s in self.sequences if s.action in PROBLEMS]

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> dict:
        return {**asdict(self), "changed": self.changed, "ok": self.ok}

    def error(self) -> SequenceSyncError:
        """What failed, each sequence with its fix (the others were synchronized)."""
        failed = self.failed
        return SequenceSyncError(
            f"{len(failed)} sequence{'' if len(failed) == 1 else 's'} of subscription {self.subscription!r} could "
            "not be synchronized:\n  " + "\n  ".join(f"{s.table}.{s.column}: {s.error}" for s in failed),
            detail=f"the others were {'checked (dry run)' if self.dry_run else 'synchronized'}: {self.changed} set",
            hint="fix each as said, then run `rowfilter sync-sequences` again (a sequence already past is left alone)")


def sync_sequences(spec: SubscriptionSpec, tables: Sequence[TableName] | None = None, *,
                   dry_run: bool = False) -> SequencesResult:
    """Move every sequence the subscribed ``tables`` (default all) own on the subscriber past the publisher's.

    A sequence that cannot be synchronized is reported in the result (not ``ok``; ``error()`` says each with its
    fix) and the others are synchronized still.

    :raises StateError: a table given that is not the subscription's.
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
            published = None if tables is not None else _published_sequences(spec, pub)
            if published is None:
                theirs = owned_sequences(pub, chosen)
            else:  # FOR ALL SEQUENCES: by name, as PostgreSQL 19's sequence synchronization lists and matches them
                theirs = {(n, ""): seq for n, seq in named_sequences(pub, published).items()}
            role = one(pub.execute("SELECT quote_ident(current_user)"))[0]
        if published is None:
            ours = owned_sequences(sub, chosen)
        else:
            result.published = [str(n) for n in published]
            ours = {(n, ""): seq for n, seq in named_sequences(sub, published).items()}
        for (table, column), source in theirs.items():
            entry = _plan(source, ours.get((table, column)), role)
            if published is not None and entry.action == NO_SEQUENCE:
                entry.action = NO_NAMESAKE
            if entry.action == WOULD_SET and not dry_run and entry.subscriber_sequence is not None \
                    and source.last_value is not None:
                try:
                    set_past(sub, entry.subscriber_sequence, source.last_value, table=str(table), column=column)
                    entry.action = SET
                except SequenceSyncError as e:  # this one is reported; the others go on
                    entry.action, entry.error = FAILED, " ".join(str(e).split())
            result.sequences.append(entry)
            log.info("%s.%s: %s %s (publisher %s at %s)", table, column, entry.subscriber_sequence or "-",
                     entry.action, source.sequence, source.last_value)
        for (table, column), target in ours.items():
            if (table, column) not in theirs and published is None:  # its publisher counterpart was dropped
                result.sequences.append(SequenceSync(
                    str(table), column, "-", None, target.sequence, target.next_value, target.next_value, NO_SOURCE,
                    f"the column owns {target.sequence} on the subscriber but no sequence on the publisher (dropped "
                    "there?), so nothing tells how far it must move: set it past the table's values on the subscriber "
                    f"(SELECT setval('{target.sequence}', max({column})) FROM {table}), or drop it there"))
        for entry in result.sequences:
            if entry.error:
                log.error("%s.%s: %s", entry.table, entry.column, entry.error)
        if not result.ok and not dry_run:  # one error of the run, however many sequences (pg_stat_subscription_stats)
            conflicts.count_error(sub, spec.subscription, "sync_seq_error_count")
    return result


def _published_sequences(spec: SubscriptionSpec, pub) -> list[TableName] | None:
    """What the subscription's publications publish of sequences, when one of them is ``FOR ALL SEQUENCES`` (a
    publications file's, on a publisher of any version; the catalog's from PostgreSQL 19); None otherwise."""
    ddl = spec.publications_sql()
    if ddl is None:
        return all_sequences_published(pub, spec.publication_names)
    publications = publications_from_ddl(ddl, read_catalog(pub))
    if not any(publications[n].all_sequences for n in spec.publication_names if n in publications):
        return None
    return publishable_sequences(pub)


def _plan(source: OwnedSequence, target: OwnedSequence | None, role: str) -> SequenceSync:
    """What to do with ``target`` so that its next value comes after ``source``'s last (before, for descending);
    ``role``: the publisher's, named in the fix of a sequence it may not read."""
    entry = SequenceSync(str(source.table), source.column, source.sequence, source.last_value,
                         None if target is None else target.sequence, None if target is None else target.next_value,
                         None if target is None else target.next_value, WOULD_SET)
    if target is None:
        entry.action = NO_SEQUENCE
    elif not source.readable:
        entry.action = UNREADABLE
        entry.error = (f"permission denied for sequence {source.sequence} on the publisher (role {role} has neither "
                       f"SELECT nor USAGE on it): GRANT SELECT ON SEQUENCE {source.sequence} TO {role} there")
    elif source.last_value is None:
        entry.action = UNUSED
    elif (target.next_value > source.last_value) if target.increment > 0 else (target.next_value < source.last_value):
        entry.action = PAST
    else:
        entry.after = source.last_value + target.increment
    return entry

