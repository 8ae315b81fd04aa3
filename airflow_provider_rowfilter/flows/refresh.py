"""RefreshPublication: reconcile a subscription with its publications (``ALTER SUBSCRIPTION … REFRESH PUBLICATION``).

Validate the definitions (and change nothing when they are invalid), make the capture publications
publish each subscribed leaf for the actions its publications publish (``filtering: spark``; under
``source`` the slot is read through the subscription's own publications and ours are dropped: no
object of ours on the publisher can make its DML fail), create the slot if missing,
then, in one subscriber transaction: a new table gets ``i`` (``r`` at the current position with
``copy_data: false``), a table no longer published is removed with its progress, and the definitions
are recorded with the position from which they apply; that position is recorded once the standbys of
``synchronized_standby_slots`` have confirmed it, so that a promoted standby has it too. Running it
twice changes nothing the second time.

A slot that is gone while tables hold positions read from it (``d``, ``f``, ``s``, ``r``) means a
gap: the changes made while it was missing were never decoded. Refresh then refuses, changing
nothing, unless ``recreate_slot``: every such table is emptied and sent back to ``i`` (the resync
path, whatever ``copy_data``: only a new copy closes a gap), then the slot is created.

With ``on_invalid_table: skip`` a table whose definition is refused does not refuse the subscription:
it is subscribed in state ``i`` with the reason as its ``last_error`` (``status``, the sensor), left
out of the capture publications, and neither copied nor applied until a refresh accepts it (the
error is then cleared and the snapshot copies it). A table already past ``i`` is still refused with
the subscription: leaving it out of the capture would lose its changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import psycopg

from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.connection import connect
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.publication.copy_definitions import AS_POSTGRESQL_LEAVES_IT, copy_definition_changes
from airflow_provider_rowfilter.core.publication.subscription_filters import (
    filters_document,
    leaf_actions,
    leaf_capture_columns,
    subscribed_tables,
)
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.slot_retention import schedule_risks
from airflow_provider_rowfilter.core.spec.schedule import longest_gap
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.publisher.capture_objects import (
    CaptureError,
    capture_names,
    current_lsn,
    drop_capture_publications,
    ensure_capture_publications,
    ensure_slot,
    invalidated_error,
    slot_exists,
)
from airflow_provider_rowfilter.publisher.catalog_reader import read_publication_state
from airflow_provider_rowfilter.publisher.definitions import load_definitions
from airflow_provider_rowfilter.publisher.failover import confirmed_timeline, switch_failover, wanted_failover
from airflow_provider_rowfilter.publisher.slot_health import read_retention, read_slot
from airflow_provider_rowfilter.publisher.standby import check_capture_source
from airflow_provider_rowfilter.subscriber.state import RelState, StateStore, migrate, relation_exists, slot_lost

log = logging.getLogger(__name__)


#: How a table refused under ``on_invalid_table: skip`` starts its ``last_error`` (cleared when accepted).
REFUSED = "refused by refresh (on_invalid_table: skip): "


@dataclass
class RefreshResult:
    subscription: str
    lsn: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    slot_created: bool = False
    capture_publication_changed: bool = False
    definitions_changed: bool = False
    resynced: list[str] = field(default_factory=list)  # sent back to i because the slot had to be recreated
    refused: dict[str, str] = field(default_factory=dict)  # on_invalid_table: skip: table -> why
    filtering: str = "spark"  # source or spark: who evaluates the definitions (core/spec/subscription.py)
    #: tables past i whose initial-copy filter or column list changed since the last refresh: what changed
    copy_definitions_changed: dict[str, str] = field(default_factory=dict)
    reconciled: list[dict] = field(default_factory=list)  # reconcile: true (or --reconcile): each table's result
    #: what the publisher itself will refuse (filtering: source), what a standby lacks, and what the schedule risks
    warnings: list[str] = field(default_factory=list)
    failover: bool = False  # the slot is a failover slot (publisher/failover.py)
    failover_switched: bool = False  # an existing slot was switched to (or from) failover

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.slot_created or self.capture_publication_changed
                    or self.definitions_changed or self.resynced or self.reconciled or self.failover_switched)


def refresh(spec: SubscriptionSpec, *, recreate_slot: bool = False, reconcile: bool | None = None) -> RefreshResult:
    """Run RefreshPublication for ``spec``; raise (having changed nothing) when the definitions are invalid
    or the slot is gone and ``recreate_slot`` was not given.

    :param reconcile: repair in place (flows/verify/reconcile.py) instead of leaving or emptying: the tables a lost slot
        had positioned (with ``recreate_slot``), and each table whose initial-copy filter or column list changed.
        None: the spec's ``reconcile``.
    """
    slot, _ = capture_names(spec.subscription)
    in_place = spec.reconcile if reconcile is None else reconcile
    resynced: list[RelState] = []
    with connect(spec.publisher, "publisher", spec) as pub:
        # The definitions and what the drift check holds the catalog against (core/publication/state.py), in one
        # snapshot: an ALTER committed in between would otherwise hide behind a state read after it.
        pub.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pub.transaction():
            definitions = load_definitions(spec, pub)
            tracked = definitions.filtering == "spark" and spec.publications_ddl is None
            state = read_publication_state(pub, spec.publication_names, _tracked_tables(definitions.filters)) \
                if tracked else None
        pub.isolation_level = None
        _refuse_positioned(spec, definitions.filters.refused)
        tables = subscribed_tables(definitions.publications, spec.publication_names, definitions.catalog)
        actions = leaf_actions(definitions.filters, definitions.publications, definitions.catalog)
        source_warnings = check_capture_source(pub, definitions.filtering)  # a standby: what it cannot do, refused
        failover = wanted_failover(spec, pub)
        had_slot = slot_exists(pub, slot)
        if had_slot:
            had_slot = not _drop_invalidated(spec, pub, slot, recreate_slot)
        if not had_slot:
            stranded = _positioned_tables(spec)
            if stranded and not recreate_slot:
                raise slot_lost(spec, slot, stranded)
            if stranded and in_place:
                _hold_for_reconcile(spec, stranded)
            elif stranded:
                _resync(spec, [r.table for r in stranded])
                resynced = stranded
        if definitions.filtering == "source":
            # Read through the subscription's own publications: none of ours is needed, and a stale one of an
            # earlier spark mode could make the publisher's own UPDATE or DELETE fail (capture_objects.py).
            dropped = drop_capture_publications(pub, spec.subscription)
            publication_changed = bool(dropped)
            if dropped:
                log.info("filtering: source: dropped the capture publications %s", ", ".join(dropped))
        else:
            # The publications first: pgoutput decodes each change with the catalog as of its position.
            publication_changed = ensure_capture_publications(
                pub, spec.subscription, actions, slot_exists=had_slot,
                columns=leaf_capture_columns(definitions.filters, definitions.catalog))
        slot_created = ensure_slot(pub, slot, failover)
        lsn = current_lsn(pub)
        # Recorded below (a table added without copy is r there; the definitions apply from there): never past what
        # the standbys of synchronized_standby_slots have confirmed, so that a promoted one has it too.
        timeline = confirmed_timeline(pub, lsn)
        retention = read_retention(pub)
    failover_switched = False
    if not slot_created:
        try:
            failover_switched = switch_failover(spec, slot, failover)
        except CaptureError as e:  # a capture reads the slot: the next refresh switches it
            source_warnings.append(str(e).replace("\n", " "))
    if slot_created:
        set_aside = open_change_log(spec).set_aside()
        if set_aside is not None:
            log.warning("a new slot %s was created: the change log of the previous one was moved to %s", slot, set_aside)
    document = filters_document(definitions.filters, spec.subscription, with_trees=True,
                                untranslatable_ok=definitions.filtering == "source")
    if state is not None:
        document["publisher"] = state  # what each apply batch holds the publisher's catalog against
    result = RefreshResult(spec.subscription, lsn, tables=[str(t) for t in tables], slot_created=slot_created,
                           capture_publication_changed=publication_changed,
                           resynced=[str(r.table) for r in resynced], filtering=definitions.filtering,
                           failover=failover, failover_switched=failover_switched,
                           warnings=[*definitions.warnings, *source_warnings,
                                     *schedule_risks(retention, longest_gap(spec.apply_schedule), spec.apply_schedule)])
    for text in result.warnings:
        log.warning("%s", text)
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        with sub.transaction():
            store.ensure_subscription(spec.publication_names, slot, capture_names(spec.subscription)[1],
                                      {"copy_data": spec.copy_data})
            added, removed = store.reconcile(tables, copy_data=spec.copy_data, current_lsn=lsn, timeline=timeline)
            result.refused = _record_refused(store, definitions.filters.refused)
            last = store.last_refresh()
            result.definitions_changed = last is None or last.definitions != document
            if added or removed or result.definitions_changed:
                store.record_refresh(lsn, added, removed, document)
            copied = [r.table for r in store.tables() if r.state is not SyncState.INIT and not r.reconciling]
            changed = copy_definition_changes(None if last is None else last.definitions, document, copied)
    result.added = [str(t) for t in added]
    result.removed = [str(t) for t in removed]
    result.copy_definitions_changed = {str(t): f"{c}; {AS_POSTGRESQL_LEAVES_IT}" for t, c in changed.items()}
    for table, change in changed.items():
        log.warning("%s: %s; %s", table, change, "it is reconciled in place now (reconcile: true)" if in_place else
                    f"{AS_POSTGRESQL_LEAVES_IT}. `rowfilter reconcile --table {table.as_sql()}` brings it to what a "
                    "new copy would hold, in place (or set reconcile: true in the spec)")
    log.info("refresh of %s at %s: added %s, removed %s", spec.subscription, lsn, result.added, result.removed)
    held = [r.table for r in _positioned_tables(spec) if r.reconciling] if in_place else []
    if in_place and (changed or held):
        from airflow_provider_rowfilter.flows.verify.reconcile import reconcile as run_reconcile

        done = run_reconcile(spec, sorted(set(changed) | set(held)))
        result.reconciled = [t.as_dict() for t in done.tables]
        if not done.ok:
            raise done.error()
    return result


def _tracked_tables(filters) -> list[TableName]:
    """The subscribed tables and their leaves: whose publication entries a drift check compares."""
    return sorted({n for t in filters.tables.values() for n in (t.table, *t.leaves)}, key=str)


def _refuse_positioned(spec: SubscriptionSpec, refused: dict[TableName, str]) -> None:
    """``on_invalid_table: skip`` skips only tables not copied yet: refuse (changing nothing) when a refused
    table already holds a position, as its changes would stop being captured."""
    if not refused:
        return
    positioned = {r.table: r for r in _positioned_tables(spec)}
    for table, reason in refused.items():
        if table in positioned:
            raise RowFilterError(
                f"table {table} is refused and already replicated (state {positioned[table].state.value}): {reason}",
                table=str(table), hint="fix the table's definition and run refresh again; on_invalid_table: skip "
                "leaves out only tables not copied yet (to stop replicating it, remove it from the publications)")


def _record_refused(store: StateStore, refused: dict[TableName, str]) -> dict[str, str]:
    """In refresh's transaction: each refused table (in ``i``) gets the reason as its ``last_error``; a table
    refused before and accepted now loses it. Returns the refused tables and reasons, for the job's output."""
    for rel in store.tables():
        reason = refused.get(rel.table)
        if reason is not None and rel.last_error != REFUSED + reason:
            store.record_error(rel.table, REFUSED + reason)
        elif reason is None and (rel.last_error or "").startswith(REFUSED):
            store.record_error(rel.table, None)
    for table, reason in refused.items():
        log.warning("%s: refused and skipped (on_invalid_table: skip); not copied or applied until a refresh "
                    "accepts it: %s", table, reason)
    return {str(t): r for t, r in refused.items()}


def _positioned_tables(spec: SubscriptionSpec) -> list[RelState]:
    """The subscription's tables whose position came from its slot (every state but ``i``)."""
    with connect(spec.subscriber, "subscriber", spec) as sub:
        if not relation_exists(sub, "subscription_rel"):
            return []
        return [r for r in StateStore(sub, spec.subscription).tables() if r.state is not SyncState.INIT]


def _hold_for_reconcile(spec: SubscriptionSpec, stranded: list[RelState]) -> None:
    """A lost slot, repaired in place: each table it had positioned is held in ``d`` for a reconcile (its rows kept),
    in one transaction, before the new slot exists; the reconcile after the refresh compares it at a point of
    the new slot (flows/verify/reconcile.py)."""
    from airflow_provider_rowfilter.flows.verify.reconcile import hold

    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        with sub.transaction():
            for rel in store.tables([r.table for r in stranded]):
                hold(store, rel.table, rel.state)
    log.warning("slot of %s recreated: %s kept and held for a reconcile in place", spec.subscription,
                ", ".join(str(r.table) for r in stranded))


def _drop_invalidated(spec: SubscriptionSpec, pub: psycopg.Connection, slot: str, recreate_slot: bool) -> bool:
    """An invalidated slot (``invalidation_reason``) counts as gone: refused while tables hold positions read from
    it, unless ``recreate_slot``; then (or when no table has one) it is dropped. Returns whether it was."""
    _, found = read_slot(pub, slot)
    if not found.lost:
        return False
    stranded = _positioned_tables(spec)
    if stranded and not recreate_slot:
        raise invalidated_error(found, read_retention(pub), [(str(r.table), r.lsn) for r in stranded])
    pub.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    log.warning('replication slot "%s" was invalidated (%s): dropped, a new one is created', slot, found.invalidated)
    return True


def _resync(spec: SubscriptionSpec, tables: list) -> None:
    """Empty the tables and send them back to ``i``, each in one transaction (``rowfilter resync``)."""
    from airflow_provider_rowfilter.flows.table_sync.sync import resync  # the copy's modules: only on this path

    resync(spec, tables)
    log.warning("slot of %s recreated: %s emptied and sent back to state i for a new copy", spec.subscription,
                ", ".join(str(t) for t in tables))
