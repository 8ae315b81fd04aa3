"""What one batch applies, decided before anything is staged: the slice of the log, the tables, the checks.

The log is first proven continuous from the tables' lowest position to its end (change_log/log.py).
A batch then takes whole segments (whole transactions) past that position, about ``max_changes``
changes of them, all captured in one filtering mode; reads each subscriber table it applies
(subscriber/apply_target.py) and the definitions in force for each change (core/apply/plan.py); and
holds the segments' relations against those definitions before any reducer runs: a relation the
definitions no longer describe, a publication changed since the refresh, or (for a publications file) a
replica identity that cannot carry the filter stops the batch untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg

from airflow_provider_rowfilter.change_log.log import ChangeLog, Segment
from airflow_provider_rowfilter.change_log.segment_reader import (
    segment_counts,
    segment_filtering,
    segment_identities,
    segment_relations,
)
from airflow_provider_rowfilter.change_log.unrecorded import remove_unrecorded
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.apply.plan import PASS_THROUGH, ApplyPlan, Epochs, TargetPlan, epochs_from_history
from airflow_provider_rowfilter.core.apply.relation_checks import RelationSpan, check_identities, check_relations
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.publication.state import changes, drift_error, renamed_state
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.result import ApplyResult, batch_span
from airflow_provider_rowfilter.flows.apply.schema_follow import (
    PublisherColumn,
    SchemaChange,
    plan_all,
    read_publisher_columns,
    renamed_rules,
)
from airflow_provider_rowfilter.publisher.catalog_reader import read_publication_state, table_names, tables_present
from airflow_provider_rowfilter.subscriber.apply_target import ApplyTarget, read_target
from airflow_provider_rowfilter.subscriber.state import APPLIED, RelState, StateStore, SubscriptionRow

log = logging.getLogger(__name__)


@dataclass
class BatchPlan:
    """One batch: the tables it applies (as they stood when it began) and the segments due for them."""

    rels: list[RelState]  # the tables in f, s or r
    end: int  # the batch applies the log through this position
    whole: bool  # the batch reaches the log's end (False: more of the log is due)
    filtering: str  # source or spark: who evaluated the publications of every change of the batch
    segments: list[Segment] = field(default_factory=list)  # those with changes (a heartbeat's has none)
    logged: list[tuple[int, int]] = field(default_factory=list)  # (transactions, changes) of each segment
    skip_lsn: int | None = None  # the remote transaction to skip (ALTER SUBSCRIPTION … SKIP)
    plan: ApplyPlan | None = None  # what the reducers evaluate; None when no segment has changes
    targets: dict[int, ApplyTarget] = field(default_factory=dict)  # by the plan's target index
    spans: list[RelationSpan] = field(default_factory=list)  # the relations of the segments
    # the targets judged change by change, every change a phase (subscriber/change_by_change.py)
    exact: frozenset[int] = frozenset()
    #: schema_changes: follow: the DDL each target gets first, in the batch's transaction (apply/schema_follow.py)
    schema: dict[int, list[SchemaChange]] = field(default_factory=dict)

    @property
    def logged_changes(self) -> int:
        return sum(c for _, c in self.logged)

    @property
    def paths(self) -> list[str]:
        return [str(s.path) for s in self.segments]


def plan_batch(spec: SubscriptionSpec, sub: psycopg.Connection, store: StateStore, subscription: SubscriptionRow,
               change_log: ChangeLog, result: ApplyResult, max_changes: int) -> BatchPlan | None:
    """The next batch of the log past the tables' positions, checked; None when nothing is due.

    Records in ``result`` the tables' states and the batch's LSN range (what an error about it names).

    :raises ChangeLogError: the log misses changes the tables need (nothing changed).
    :raises RelationChangedError, PublicationChangedError: a change due in the batch cannot be judged as
        the definitions say (nothing changed).
    """
    end = change_log.captured_through()
    tables = store.tables()
    rels = [r for r in tables if r.state in APPLIED]
    result.states = {str(r.table): r.state.value for r in tables}
    segments = _check_log(spec, store, change_log, end)
    if end is None or not rels:
        log.info("%s: nothing to apply (%s)", spec.subscription,
                 "no table has finished its copy" if end is not None else "nothing captured yet")
        return None
    positions = {r.table: parse_lsn(r.lsn) for r in rels}
    since = min(positions.values())
    counted = [(s, segment_counts(s.path)) for s in segments]
    log_end = end
    counted, end, filtering = _one_filtering(counted, end)
    if end < since:
        # The log ends behind every table (an older log switched to in the spec, proven to miss nothing
        # they need): no change is due, and a batch ending before it starts would be recorded.
        log.info("%s: nothing to apply (the change log ends at %s, behind the tables' lowest position %s)",
                 spec.subscription, format_lsn(end), format_lsn(since))
        return None
    taken = _slice(counted, max_changes)
    whole = taken == len(counted) and end == log_end
    if taken < len(counted):
        counted = counted[:taken]
        end = counted[-1][0].end_lsn
    # A heartbeat's segment holds no change: Spark is not started for it (nor for nothing at all).
    counted = [(s, c) for s, c in counted if c[1]]
    result.start_lsn, result.end_lsn = format_lsn(since), format_lsn(end)
    batch = BatchPlan(rels, end, whole, filtering, [s for s, _ in counted], [c for _, c in counted],
                      None if subscription.skip_lsn is None else parse_lsn(subscription.skip_lsn))
    if batch.segments:
        epochs = epochs_from_history([(r.lsn, r.definitions) for r in store.refreshes()], since)
        spans = [span for segment in batch.segments for span in segment_relations(segment.path)]
        shapes = {}
        for index, rel in enumerate(rels):
            batch.targets[index] = read_target(sub, rel.table, index)
            if filtering == "source":  # pgoutput judged: the changes pass through (core/apply/plan.py)
                shapes[index] = (rel.table,), (PASS_THROUGH,)
            else:
                shapes[index] = epochs.leaves(rel.table), epochs.rules(rel.table)
        renames: list[tuple[TableName, str, str, str]] = []
        if spec.schema_changes != "stop":  # the DDL the batch's transaction runs first (apply/schema_follow.py)
            batch.schema = _follow(spec, batch.targets, {i: shapes[i][0] for i in shapes},
                                   {i: positions[rel.table] for i, rel in enumerate(rels)}, spans)
            if filtering == "spark":  # the definitions recorded by name follow the renames, as PostgreSQL's do
                renames = [*store.schema_renames(), *((c.table, c.column, c.new_name or "", format_lsn(c.lsn))
                                                      for planned in batch.schema.values() for c in planned
                                                      if c.kind == "rename")]
                for index, rel in enumerate(rels):
                    shapes[index] = shapes[index][0], renamed_rules(rel.table, shapes[index][1], epochs.starts, renames)
        plans = [TargetPlan(index, rel.table, shapes[index][0], positions[rel.table], batch.targets[index].column_names,
                            batch.targets[index].key, shapes[index][1]) for index, rel in enumerate(rels)]
        batch.plan = ApplyPlan((0,) if filtering == "source" else epochs.starts, tuple(plans), batch.skip_lsn,
                               spec.conflict_policy)
        batch.spans = _check_relations(spec, spans, batch.plan, epochs, since, filtering)
        if filtering == "spark":
            followed = [(str(t), old, new) for t, old, new, lsn in renames if parse_lsn(lsn) > epochs.starts[-1]] \
                if epochs.starts else []
            _check_publications(spec, epochs, batch_span(result.start_lsn, result.end_lsn), followed)
            if spec.publications_ddl:  # the publisher does not know them: it could not refuse what they forbid
                check_identities(batch.plan, epochs,
                                 lambda: [i for s in batch.segments for i in segment_identities(s.path)])
    return batch


def _check_log(spec: SubscriptionSpec, store: StateStore, change_log: ChangeLog, end: int | None) -> list[Segment]:
    """The segments to apply, once the log is proven continuous from the tables' lowest position to its end.

    Refuses (ChangeLogError, nothing changed) a log with a gap, naming it and the log on record.
    A log other than the one on record (another directory, or a new one in its place) is accepted
    when nothing the tables need is missing, with a warning naming both, and recorded from now on.
    """
    needs = store.log_needs()
    segments = [] if end is None or needs.since is None else change_log.continuous(needs.since, end, needs)
    identity = change_log.identity()
    if identity is not None and identity != needs.recorded:
        if needs.recorded is not None and needs.recorded.id != identity.id:
            log.warning("subscription %s: its change log was %s (id %s); it is now %s (id %s), which holds everything "
                        "its tables need", spec.subscription, needs.recorded.location, needs.recorded.id,
                        identity.location, identity.id)
        with store.conn.transaction():
            store.record_change_log(identity)
        remove_unrecorded(change_log, identity, previous=needs.recorded)  # the one it replaced, and any set aside
    elif identity is not None:
        remove_unrecorded(change_log, identity)  # set aside by a refresh --recreate-slot (or left by a locked run)
    return segments


def _slice(counted: list[tuple[Segment, tuple[int, int]]], max_changes: int) -> int:
    """How many of the due segments (with their counts) one batch applies: about ``max_changes`` changes.

    Whole segments (whole transactions), at least one with changes; so a backlog already in the log
    (captured by a run that stopped before applying it) is applied in bounded batches too.
    """
    changes = 0
    for taken, (_, (_, n)) in enumerate(counted):
        if n and changes and changes + n > max_changes:
            return taken
        changes += n
    return len(counted)


def _one_filtering(counted: list[tuple[Segment, tuple[int, int]]], end: int
                   ) -> tuple[list[tuple[Segment, tuple[int, int]]], int, str]:
    """The batch's segments up to the first captured in the other mode (change_log/segment_reader.py ``segment_filtering``),
    the batch's end, and its mode: a batch is judged one way; the next batch takes the rest."""
    if not counted:
        return counted, end, "spark"
    modes = [segment_filtering(s.path) for s, _ in counted]
    cut = next((i for i, m in enumerate(modes) if m != modes[0]), None)
    if cut is None:
        return counted, end, modes[0]
    log.info("the change log's filtering changes from %s to %s at %s: this batch ends there", modes[0], modes[cut],
             format_lsn(counted[cut][0].start_lsn))
    return counted[:cut], counted[cut][0].start_lsn, modes[0]


def _check_relations(spec: SubscriptionSpec, spans: list[RelationSpan], plan: ApplyPlan, epochs: Epochs,
                     since: int, filtering: str) -> list[RelationSpan]:
    """The relations of the batch's segments (metadata only), held against the plan before any Spark work.

    Read through the subscription's own publications (``filtering`` source), the slot also sends tables
    added to them since the last refresh: those are told from renamed ones by the publisher's catalog.

    :raises RelationChangedError: a change due in this batch has a relation the definitions no longer describe.
    """
    known = sorted({TableName.parse(n) for doc in epochs.documents for e in doc["tables"]
                    for n in (e["table"], *e["leaves"])}, key=str)
    check_relations(plan, epochs, spans, since, lambda oids: _publisher_names(spec, oids),
                    (lambda: _all_present(spec, known)) if filtering == "source" else None)
    return spans


def _follow(spec: SubscriptionSpec, targets: dict[int, ApplyTarget], leaves: dict[int, Sequence[TableName]],
            positions: dict[int, int], spans: Sequence[RelationSpan]) -> dict[int, list[SchemaChange]]:
    """The schema changes the batch's relations show, planned for each target (``targets`` reshaped in place).

    The publisher's catalog is read only for a table whose relation differs from the subscriber's.
    """
    pub: list[psycopg.Connection] = []
    try:
        def columns(oid: int) -> list[PublisherColumn]:
            if not pub:
                pub.append(connect(spec.publisher, "publisher", spec))
            return read_publisher_columns(pub[0], oid)
        found = plan_all(spec.schema_changes, targets, leaves, positions, spans, columns)
    finally:
        for conn in pub:
            conn.close()
    for planned in found.values():
        for change in planned:
            log.info("%s: schema: %s", change.table, change.describe())
    return found


def _check_publications(spec: SubscriptionSpec, epochs: Epochs, span: str,
                        renamed: Sequence[tuple[str, str, str]] = ()) -> None:
    """Judged in Spark, the definitions of the last refresh must still be the publisher's (core/publication/state.py).

    One query on the publisher, after this batch's capture: when it still says what the refresh recorded,
    every change captured so far was committed before any ALTER still to come, and is judged as pgoutput
    would; when not, the batch stops untouched.

    ``renamed``: the columns ``schema_changes: follow`` renamed since that refresh (table, old, new), which the
    publisher's stored filters and column lists follow (core/publication/state.py ``renamed_state``).

    :raises PublicationChangedError: naming each publication and table and what changed.
    """
    recorded = epochs.documents[-1].get("publisher") if epochs.documents else None
    if recorded is None:
        return  # definitions from a publications file (the user's to change), or recorded before the check
    if renamed:
        recorded = renamed_state(recorded, renamed)
    tables = [TableName.parse(t) for t in recorded["present"]]
    with connect(spec.publisher, "publisher", spec) as pub:
        found = changes(recorded, read_publication_state(pub, spec.publication_names, tables))
    if found:
        raise drift_error(spec.subscription, format_lsn(epochs.starts[-1]), found, span)


def _all_present(spec: SubscriptionSpec, names: Sequence[TableName]) -> bool:
    """Whether every one of the tables ``names`` exists on the publisher under that name (False when unreadable)."""
    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            return tables_present(pub, names)
    except (RowFilterError, psycopg.Error) as e:
        log.warning("cannot read the publisher's tables (%s): a relation no refresh added is taken as renamed", e)
        return False


def _publisher_names(spec: SubscriptionSpec, oids: Sequence[int]) -> dict[int, TableName]:
    """The publisher's current names of tables by OID (which table a renamed relation was); {} when unreadable."""
    try:
        with connect(spec.publisher, "publisher", spec) as pub:
            return table_names(pub, oids)
    except (RowFilterError, psycopg.Error) as e:
        log.warning("cannot read the publisher's table names (%s): relations it renamed are taken as unknown", e)
        return {}
