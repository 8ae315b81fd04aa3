"""ONE subscriber transaction per batch: every table's net effect, every table's position and state, the batch's record.

Exactly once (docs/apply.md): the rows of the tables, their positions (``f`` → ``s`` → ``r``, or ``r``'s
LSN) and the batch's row in ``rowfilter.batch_history`` commit together, or nothing does. The tables'
state rows are locked before they are read again, so a resync committed while the batch was reduced is
seen (that table is left to the next batch). Each table is applied under a savepoint: a conflict in one
table is kept while the others are tried, and the first in commit order stops the batch, as
PostgreSQL's apply worker stops at it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import psycopg
from psycopg import sql

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.connection import primary_message
from airflow_provider_rowfilter.core.apply.plan import TargetPlan
from airflow_provider_rowfilter.core.apply.relation_checks import RelationSpan
from airflow_provider_rowfilter.core.errors import ApplyError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.apply.batch_plan import BatchPlan
from airflow_provider_rowfilter.flows.apply.reducers import Staged
from airflow_provider_rowfilter.flows.apply.result import ApplyResult
from airflow_provider_rowfilter.flows.apply.schema_follow import run_changes
from airflow_provider_rowfilter.subscriber import conflicts, replication_origin
from airflow_provider_rowfilter.subscriber.apply_stage import STAGE, clear_stage, stage_more
from airflow_provider_rowfilter.subscriber.apply_target import (
    ApplyTarget,
    ConflictError,
    StagedTable,
    TableCounts,
    rejected_column,
)
from airflow_provider_rowfilter.subscriber.change_by_change import ChangeByChange
from airflow_provider_rowfilter.subscriber.replica_role import replica_role
from airflow_provider_rowfilter.subscriber.state import APPLIED, RelState, StateStore
from airflow_provider_rowfilter.subscriber.typed_keys import stage_rows

log = logging.getLogger(__name__)


def commit_batch(spec: SubscriptionSpec, sub: psycopg.Connection, store: StateStore, batch: BatchPlan,
                 staged: Staged, result: ApplyResult, began: float) -> None:
    """Apply the staged batch and move the tables' positions in one transaction; record the batch in ``result``.

    :raises ConflictError: a change conflicts (the first in commit order; nothing of the batch was applied).
    :raises ChangeByChange: a table's net effects cannot answer as PostgreSQL would: reduce the batch again with
        those tables' changes one by one (``BatchPlan.exact``); nothing of the batch was applied.
    :raises ApplyError: a table refused a value or a statement (nothing of the batch was applied).
    """
    faults.point("apply-after-stage")
    # Tagged with the subscription's replication origin, as the apply worker's writes are (a downstream
    # origin = none then skips them: subscriber/replication_origin.py).
    with replication_origin.session_origin(sub, spec.subscription) as tagged, sub.transaction():
        if tagged:
            replication_origin.record_progress(sub, format_lsn(batch.end))
        # The origin our writes carry: a local row another one last modified is *_origin_differs (PostgreSQL 18).
        origin = replication_origin.origin_id(sub, spec.subscription) if tagged else 0
        # Lock the rows first, then read them: read before the lock, a resync committed in between would be missed.
        store.lock_tables()
        current = {r.table: r for r in store.tables() if r.state in APPLIED}
        # Rows reduced in this process are written once: each table's keys straight into its typed keys table
        # (subscriber/typed_keys.py), the barriers into the transaction's own stage (subscriber/apply_stage.py).
        stage, key_rows = (STAGE, {}) if staged.rows is None else stage_rows(sub, staged.rows)
        replica_role(sub, "apply", tables=[rel.table for index, rel in enumerate(batch.rels) if index in batch.targets])
        # schema_changes: follow: each table's DDL first (a column added, renamed, widened), in this transaction.
        for changes in batch.schema.values():
            run_changes(sub, changes)
        if batch.schema:
            faults.point("apply-after-schema")
        stops: list[ConflictError] = []
        one_by_one: set[int] = set()  # the tables whose changes must be judged one by one (ChangeByChange)
        met: dict[TableName, dict[str, int]] = {}  # the conflicts the batch went on from, per table
        counts: dict[TableName, TableCounts] = {}
        conflict_log = (conflicts.ConflictLog(spec.subscription, result.start_lsn, format_lsn(batch.end))
                        if spec.conflict_log == "table" else None)
        for index, rel in enumerate(batch.rels):
            now = current.get(rel.table)
            if now is None or (now.state, now.lsn) != (rel.state, rel.lsn):
                log.warning("%s: its state moved during the batch (%s %s → %s); applied by the next batch",
                            rel.table, rel.state.value, rel.lsn, "gone" if now is None else now.state.value)
                continue
            if index in batch.targets:
                target = batch.targets[index]
                sub.execute("SAVEPOINT rowfilter_table")
                table = StagedTable(sub, staged.token, target, spec.conflict_policy, conflict_log, result.span,
                                    origin, stage)
                table.exact = index in batch.exact
                table.rows = key_rows.get(target.index)
                try:
                    counts[rel.table] = table.apply()
                    sub.execute("RELEASE SAVEPOINT rowfilter_table")
                except ChangeByChange as e:
                    sub.execute("ROLLBACK TO SAVEPOINT rowfilter_table")
                    one_by_one |= e.targets
                    log.info("%s; its changes in this batch are judged one by one, as PostgreSQL applies them", e)
                    continue
                except ConflictError as e:
                    sub.execute("ROLLBACK TO SAVEPOINT rowfilter_table")
                    stops.append(e)
                    met[rel.table] = conflicts.conflicts_of(table.counts.as_dict())  # its phases before the stop
                    continue
                except psycopg.errors.DataError as e:  # SQLSTATE class 22: a value the column cannot take
                    sub.execute("ROLLBACK TO SAVEPOINT rowfilter_table")
                    assert batch.plan is not None  # a table is targeted only by a batch with changes
                    if target.index in key_rows:  # the column is found in the stage: its keys go there now
                        stage_more(sub, key_rows[target.index])
                    raise _value_error(sub, staged.token, target, batch.plan.targets[index], batch.spans, e,
                                       stage) from e
                except (psycopg.errors.IntegrityError, psycopg.errors.ProgrammingError) as e:
                    raise _table_error(target, result, e) from e
                counts[rel.table].extra = staged.extra.get(index, {})
                # The skipped conflicts' running counts, committed with the batch (subscriber/conflicts.py).
                met[rel.table] = conflicts.conflicts_of(counts[rel.table].as_dict())
                conflicts.count_batch(sub, spec.subscription, result.start_lsn, rel.table, met[rel.table])
                faults.point("apply-mid-transaction")
            _move(store, rel, batch.end)
        if one_by_one:
            raise ChangeByChange(one_by_one, "judged one by one")  # the batch's transaction rolls back
        if stops:
            # The first in commit order, as PostgreSQL stops; a conflict of a key several transactions changed is known
            # by its batch only: after those of a known transaction.
            stop = min(stops, key=lambda c: (c.commit_lsn is None, c.commit_lsn or 0))
            # Counted after the rollback all the same, as PostgreSQL's counts do not roll back (flows/apply/drain.py).
            stop.met, stop.batch_start = {t: c for t, c in met.items() if c}, result.start_lsn
            raise stop
        for changes in batch.schema.values():
            run_changes(sub, changes, after=True)  # follow_drops: a column dropped, once the rows that had it are in
        schema = [c for changes in batch.schema.values() for c in changes]
        result.schema_changes = [f"{c.table}: {c.describe()}" for c in schema]
        conflicts.clear_stopped(sub, spec.subscription)
        skip_lsn = batch.skip_lsn
        if skip_lsn is not None and (staged.skipped or skip_lsn < batch.end):
            if staged.skipped:
                log.info("skipped the remote transaction finished at %s (rowfilter skip)", format_lsn(skip_lsn))
                result.skipped_lsn = format_lsn(skip_lsn)
            else:
                log.warning('skip-LSN of subscription "%s" cleared: no remote transaction finished at %s',
                            spec.subscription, format_lsn(skip_lsn))
            store.set_skip_lsn(None)
        result.tables = {str(t): c.as_dict() for t, c in counts.items()}
        result.duration_ms = round((time.monotonic() - began) * 1000)
        result.batch_id = store.record_batch(
            start_lsn=result.start_lsn, end_lsn=format_lsn(batch.end), counts=result.tables,
            duration_ms=result.duration_ms, transactions=result.transactions, changes=result.changes,
            skipped_lsn=result.skipped_lsn, lag_bytes=result.lag_bytes, lag_seconds=result.lag_seconds,
            schema_changes=[c.as_dict() for c in schema])
        clear_stage(sub, spec.subscription)
    faults.point("apply-after-commit")


def _move(store: StateStore, rel: RelState, end: int) -> None:
    """The table has everything through ``end``: f → s → r (PostgreSQL's SYNCDONE, then READY), or r's position."""
    position = max(parse_lsn(rel.lsn), end)
    if rel.state is SyncState.READY:
        store.advance(rel.table, format_lsn(position))
        return
    if parse_lsn(rel.lsn) > end:
        return  # the log does not reach the copy's position yet: nothing of this table was due
    if rel.state is SyncState.FINISHED_COPY:
        store.set_state(rel.table, SyncState.SYNCHRONIZED, lsn=rel.lsn)
    store.set_state(rel.table, SyncState.READY, lsn=format_lsn(position))


def _value_error(sub: psycopg.Connection, token: str, target: ApplyTarget, plan: TargetPlan,
                 spans: Sequence[RelationSpan], e: psycopg.Error, stage: sql.Composable) -> ApplyError:
    """A staged value the subscriber's column cannot take: name the column and where the publisher began sending it.

    As PostgreSQL's apply worker reports it (``slot_store_error_callback`` in
    src/backend/replication/logical/worker.c: "processing remote data for replication target relation
    … column …"), found by casting the staged values of each column in turn.
    """
    column = rejected_column(sub, token, target, stage)
    since = publisher_type = None
    if column is not None:
        sent = [(s.due_from(plan.position), s.column_types[s.column_names.index(column.name)]) for s in spans
                if s.name in plan.leaves and column.name in s.column_names
                and s.column_types[s.column_names.index(column.name)] != column.type_sql]
        since, publisher_type = min(((lsn, t) for lsn, t in sent if lsn is not None), default=(None, None))
    where = f'replication target relation "{target.table}"' + (f' column "{column.name}"' if column else "")
    detail = f"While applying the batch's changes to {where}"
    if since is not None:
        detail += (f": the publisher sends the column as {publisher_type}, the subscriber's column is "
                   f"{column.type_sql}, from the transaction finished at {format_lsn(since)} on")
    return ApplyError(
        primary_message(e), table=str(target.table), detail=detail + ". Nothing of the batch was applied.",
        hint=(f"change the subscriber's column to a type that takes the publisher's values (ALTER TABLE "
              f"{target.table} ALTER COLUMN {column.name} TYPE …) and run again" if column else
              f"make {target.table} in the subscriber take the publisher's values and run again")
        + "; the change log keeps the batch")


def _table_error(target: ApplyTarget, result: ApplyResult, e: psycopg.Error) -> ApplyError:
    """A statement on a subscriber table failed (a constraint, a permission): PostgreSQL's message, with the table."""
    return ApplyError(primary_message(e), table=str(target.table),
                      detail=f"While applying the batch's changes ({result.span}) to {target.table}. "
                      "Nothing of the batch was applied.",
                      hint=f"make {target.table} in the subscriber accept the changes and run again; the change "
                      "log keeps the batch")
