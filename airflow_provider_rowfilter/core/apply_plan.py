"""What one apply batch evaluates, per subscriber table and per definitions epoch (no Spark, no database).

A batch captured with ``filtering: source`` evaluates nothing: every table takes :data:`PASS_THROUGH`.
The rest of this text is about batches captured for Spark to judge (``filtering: spark``).

A refresh records the effective definitions with the position from which they hold
(``rowfilter.refresh_history``); a change is judged by the definitions of the latest refresh at or
before its ``commit_lsn`` (pgoutput.c reads the publications in the decoding's historic snapshot
and rebuilds ``get_rel_sync_entry``'s entry on ``publication_invalidation_cb``), so an epoch is the
LSN range between two refreshes. The filters
come as the Spark expression trees the refresh translated (``spark_filter_trees``, loaded with
``sqlglot.serde``; documents recorded before the trees give the Spark SQL text ``spark_filters``,
parsed once here); :func:`filter_expression` rewrites each column reference into a typed read of the
change's values (PostgreSQL text form, cast to the column's Spark type).

Before any of that, :func:`check_relations` holds the relations the change log's segments carry
against the definitions: a change is judged by table and column *names*, so a change whose relation
was renamed on the publisher (or lost a column the definitions read) must stop the batch, not be
dropped as "not subscribed" or "filtered".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp, serde

from airflow_provider_rowfilter.core.errors import RowFilterError, UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types
from airflow_provider_rowfilter.core.filters.spark_translation import typed_read
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec import ConflictPolicy

DML = ("insert", "update", "delete")
#: A batch's bound unless the run sets one (``--max-changes``): the slot rows one capture reads, whole
#: transactions (publisher/capture.py), and about the changes one batch applies (apply/batch_plan.py).
DEFAULT_MAX_CHANGES = 100_000


@dataclass(frozen=True)
class EpochRules:
    """One table's definitions in one epoch: what is published and with which filters and columns."""

    actions: frozenset[str]  # insert, update, delete, truncate
    filters: dict[str, exp.Expr | None]  # DML action -> Spark filter tree (None: unfiltered)
    columns: tuple[str, ...] | None  # the column list, None when there is none
    column_types: dict[str, str]  # format_type() of the columns the filters read

    @classmethod
    def from_document(cls, entry: dict) -> EpochRules:
        if entry.get("spark_untranslatable"):
            # Recorded for the publisher to evaluate (filtering: source); changes captured for Spark to judge
            # in that epoch cannot be judged exactly.
            raise UntranslatableFilterError(
                f'the filters of table {entry["table"]} cannot be evaluated in Spark: {entry["spark_untranslatable"]}',
                detail="the refresh recorded them for the publisher to evaluate (filtering: source), but the change "
                "log holds changes of that table captured for Spark to judge (filtering: spark). Nothing was "
                "applied",
                hint="set filtering: auto (or source) in the spec and run `rowfilter refresh`; or rewrite the filter "
                "on the publisher into one Spark evaluates exactly and run `rowfilter refresh`",
                table=entry["table"])
        return cls(
            actions=frozenset(entry["actions"]),
            filters={a: _filter_tree(entry, a) for a in DML if a in entry["actions"]},
            columns=None if entry.get("columns") is None else tuple(entry["columns"]),
            column_types=dict(entry.get("filter_column_types") or {}),
        )

    def publishes_column(self, name: str) -> bool:
        return self.columns is None or name in self.columns


def _filter_tree(entry: dict, action: str) -> exp.Expr | None:
    """An action's Spark filter tree as the refresh recorded it; from its Spark SQL text in older documents."""
    trees = entry.get("spark_filter_trees")
    if trees is not None:
        dumped = trees.get(action)
        if dumped is None:
            return None
        loaded = serde.load(dumped)
        assert isinstance(loaded, exp.Expr), f"a recorded filter tree loads as {type(loaded).__name__}"
        return loaded
    text = entry["spark_filters"].get(action)
    return None if text is None else sqlglot.parse_one(text, dialect="spark")


#: The rules of every table in a batch captured with ``filtering: source``: pgoutput has already applied
#: the row filters, the publish lists, the column lists and the UPDATE transformation (pgoutput_change and
#: pgoutput_row_filter in src/backend/replication/pgoutput/pgoutput.c), as of each change's position, so the
#: apply takes each change as it arrived, as the apply worker does: every operation, no filter, the columns
#: the change carries (its Relation message lists only the published ones). Relations arrive under the name
#: they are published as (the root under publish_via_partition_root), so each table is its own only leaf.
PASS_THROUGH = EpochRules(actions=frozenset({"insert", "update", "delete", "truncate"}),
                          filters=dict.fromkeys(DML), columns=None, column_types={})


@dataclass(frozen=True)
class TargetPlan:
    """One subscriber table the batch applies to."""

    index: int
    table: TableName
    leaves: tuple[TableName, ...]
    position: int  # apply changes with commit_lsn >= position
    columns: tuple[str, ...]  # the subscriber's writable columns, in its order
    key: tuple[str, ...]  # the subscriber's key columns
    rules: tuple[EpochRules | None, ...]  # per epoch; None: not subscribed then


@dataclass(frozen=True)
class ApplyPlan:
    epochs: tuple[int, ...]  # the LSN each epoch starts at, ascending (epoch 0 also covers anything before)
    targets: tuple[TargetPlan, ...]
    skip_lsn: int | None = None
    policy: ConflictPolicy = "error"


@dataclass
class BatchFacts:
    """What a judged batch says before anything is staged (spark/apply_frames.py, apply/net_effect.py)."""

    counts: dict[int, dict[str, int]]  # per target: filtered, unpublished, update_to_insert, update_to_delete, skipped
    column_sets: list[tuple[int, tuple[str, ...], int]]  # (target, published columns, first commit_lsn)
    barrier_targets: list[int]
    changes: int
    skipped: bool  # the batch holds the transaction being skipped
    # per target without a key: (commit_lsn, kind) of its first UPDATE or DELETE the publisher sent without
    # REPLICA IDENTITY FULL (worker.c check_relation_updatable refuses it)
    unkeyed: dict[int, tuple[int, str]] = field(default_factory=dict)


def read_facts(plan: ApplyPlan, rows: Iterable[Mapping]) -> BatchFacts:
    """The facts from the judged changes counted by group: each row has the group's ``_tgt``, ``_epoch``,
    ``kind``, ``_op`` (I U D T; x filtered, u unpublished, s skipped, n unkeyed), ``_barrier``, ``layout``
    (the columns of an I or U, else None), ``n`` (changes) and ``first`` (their lowest commit_lsn)."""
    names = {"x": "filtered", "u": "unpublished", "s": "skipped"}
    by_index = {t.index: t for t in plan.targets}
    counts: dict[int, dict[str, int]] = {}
    layouts: dict[tuple[int, tuple[str, ...]], int] = {}
    barriers: set[int] = set()
    unkeyed: dict[int, tuple[int, str]] = {}
    changes, skipped = 0, False
    for r in rows:
        tgt, op, n = r["_tgt"], r["_op"], r["n"]
        changes += n
        skipped = skipped or op == "s"
        if op == "n":
            unkeyed[tgt] = min(unkeyed.get(tgt, (r["first"], r["kind"])), (r["first"], r["kind"]))
        c = counts.setdefault(tgt, {})
        name = names.get(op) or (("update_to_insert" if op == "I" else "update_to_delete")
                                 if r["kind"] == "update" and op in ("I", "D") else None)
        if name:
            c[name] = c.get(name, 0) + n
        if r["_barrier"] or op == "T":
            barriers.add(tgt)
        if r["layout"] is not None:
            rules = by_index[tgt].rules[r["_epoch"]]
            published = tuple(col for col in r["layout"] if rules is not None and rules.publishes_column(col))
            key = (tgt, published)
            layouts[key] = min(layouts.get(key, r["first"]), r["first"])
    return BatchFacts(
        counts=counts, column_sets=sorted((t, cols, first) for (t, cols), first in layouts.items()),
        barrier_targets=sorted(barriers), changes=changes, skipped=skipped, unkeyed=unkeyed)


@dataclass(frozen=True)
class Epochs:
    """The recorded definitions that can concern changes at or after some position."""

    starts: tuple[int, ...]
    documents: tuple[dict, ...]

    def rules(self, table: TableName) -> tuple[EpochRules | None, ...]:
        result = []
        for doc in self.documents:
            entry = next((t for t in doc["tables"] if t["table"] == str(table)), None)
            result.append(None if entry is None else EpochRules.from_document(entry))
        return tuple(result)

    def leaves(self, table: TableName) -> tuple[TableName, ...]:
        """The table's leaves in the newest epoch that publishes it (the capture publication's view)."""
        for doc in reversed(self.documents):
            for t in doc["tables"]:
                if t["table"] == str(table):
                    return tuple(TableName.parse(leaf) for leaf in t["leaves"])
        return (table,)


def epochs_from_history(history: Sequence[tuple[str, dict]], since: int) -> Epochs:
    """Keep the refreshes that can govern a change at or after ``since`` (``history``: (lsn, document), any order)."""
    ordered = sorted(((parse_lsn(lsn), doc) for lsn, doc in history), key=lambda h: h[0])
    if not ordered:
        return Epochs((), ())
    first = max([i for i, (lsn, _) in enumerate(ordered) if lsn <= since], default=0)
    kept = ordered[first:]
    return Epochs(tuple(lsn for lsn, _ in kept), tuple(doc for _, doc in kept))


def filter_expression(tree: exp.Expr, column_types: dict[str, str],
                      read: Callable[[str], exp.Expr]) -> exp.Expr:
    """The filter with each column reference replaced by ``read(name)`` cast to the column's Spark type.

    ``CAST(<read('a')> AS INT)``: the value's PostgreSQL text form, converted the way the
    differential tests check (an array's elements one by one, spark_translation.py ``typed_read``); a column
    the change does not carry reads as NULL. ``tree`` is not changed.
    """

    def typed(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Column):
            return node
        name = node.name
        type_name = column_types.get(name)
        pg_type = None if type_name is None else pg_types.parse_type(type_name)
        if pg_type is None or pg_types.spark_type(pg_type) is None:
            raise UntranslatableFilterError(
                f'the filter column "{name}" has no recorded type the apply can read it as',
                hint="run `rowfilter refresh` again so the definitions record the filter columns' types")
        return typed_read(read(name), pg_type)

    return tree.transform(typed)


def case_over(branches: Iterable[tuple[exp.Expr, exp.Expr]], default: exp.Expr | None = None
              ) -> exp.Expr:
    """``CASE WHEN cond THEN value … [ELSE default] END`` (a bare default when there is no branch)."""
    case = exp.Case()
    any_branch = False
    for condition, value in branches:
        case = case.when(condition, value)
        any_branch = True
    if not any_branch:
        return default if default is not None else exp.Null()
    return case.else_(default) if default is not None else case


class RelationChangedError(RowFilterError):
    """A change's relation no longer matches the definitions the apply judges with (nothing was applied)."""

    def __init__(self, message: str, *, lsn: int, detail: str, hint: str, table: str) -> None:
        super().__init__(message, detail=detail, hint=hint, table=table)
        self.lsn = lsn


@dataclass(frozen=True)
class RelationSpan:
    """One relation definition (as pgoutput announced it) in a change-log segment, and where its changes lie."""

    oid: int
    schema: str
    table: str
    column_names: tuple[str, ...]
    column_types: tuple[str, ...]
    first_commit_lsn: int
    last_commit_lsn: int
    first_lsn: int  # LSN of its first change

    @property
    def name(self) -> TableName:
        return TableName(self.schema, self.table)

    @property
    def definition(self) -> tuple:
        return (self.oid, self.schema, self.table, self.column_names, self.column_types)

    def merged(self, other: RelationSpan) -> RelationSpan:
        return replace(self, first_commit_lsn=min(self.first_commit_lsn, other.first_commit_lsn),
                       last_commit_lsn=max(self.last_commit_lsn, other.last_commit_lsn),
                       first_lsn=min(self.first_lsn, other.first_lsn))

    def to_document(self) -> dict:
        return {"oid": self.oid, "schema": self.schema, "table": self.table, "column_names": list(self.column_names),
                "column_types": list(self.column_types), "first_commit_lsn": format_lsn(self.first_commit_lsn),
                "last_commit_lsn": format_lsn(self.last_commit_lsn), "first_lsn": format_lsn(self.first_lsn)}

    @classmethod
    def from_document(cls, d: dict) -> RelationSpan:
        return cls(int(d["oid"]), d["schema"], d["table"], tuple(d["column_names"]), tuple(d["column_types"]),
                   parse_lsn(d["first_commit_lsn"]), parse_lsn(d["last_commit_lsn"]), parse_lsn(d["first_lsn"]))

    def due_from(self, position: int) -> int | None:
        """The commit LSN of a change of this span at or after ``position`` (the first when known), else None."""
        if self.last_commit_lsn < position:
            return None
        return self.first_commit_lsn if self.first_commit_lsn >= position else self.last_commit_lsn


def check_relations(plan: ApplyPlan, epochs: Epochs, spans: Sequence[RelationSpan], since: int,
                    current_names: Callable[[Sequence[int]], Mapping[int, TableName]],
                    known_all_present: Callable[[], bool] | None = None) -> None:
    """Stop the batch when a change due in it carries a relation the definitions no longer describe.

    (a) A relation name that is no leaf of any table in any epoch of the batch: the table was renamed
    or moved on the publisher (the capture publication lists it by OID, so its changes keep coming
    under the new name). PostgreSQL's apply worker stops there too (``logicalrep_rel_open`` in
    src/backend/replication/logical/relation.c). Which table it is, is known by its OID: another
    relation of the batch with the same OID and a known name, else the publisher's current name
    (``current_names``, asked only then); the changes count when they are at or after that table's
    position, and when that is unknown, at or after the batch's lowest position ``since``. A table a
    refresh removed is a known name: its changes still in the log are simply not applied.

    With ``known_all_present`` (the slot read through the subscription's own publications, which may
    publish tables no refresh has added yet): a relation that is no known table's is a table added to a
    publication since the last refresh when every known table still exists on the publisher under its
    name (``known_all_present()``, asked once); its changes are not applied, as the apply worker
    ignores a relation that is not in ``pg_subscription_rel`` (``should_apply_changes_for_rel`` in
    src/backend/replication/logical/worker.c) until ``REFRESH PUBLICATION`` adds it.

    (b) A relation of a table applied in this batch lacks a column the definitions of a change's epoch
    read (a filter column, a column-list column): renamed on the publisher, it would read as NULL and
    the change be judged "filtered".

    :raises RelationChangedError: the first such change in commit order.
    """
    if not epochs.documents:
        return
    known = {TableName.parse(name) for doc in epochs.documents for t in doc["tables"]
             for name in (t["table"], *t["leaves"])}
    target_of = {leaf: t for t in plan.targets for leaf in t.leaves}
    problems: list[tuple[int, RelationChangedError]] = []
    unknown = [s for s in spans if s.name not in known and s.due_from(since) is not None]
    if unknown:
        by_oid = {s.oid: s.name for s in spans if s.name in known}
        missing = sorted({s.oid for s in unknown} - set(by_oid))
        if missing:
            by_oid.update({oid: name for oid, name in current_names(missing).items() if name in known})
        unrenamed: bool | None = None
        for span in unknown:
            was = by_oid.get(span.oid)
            target = target_of.get(was) if was is not None else None
            if was is not None and target is None:
                continue  # a known table not applied in this batch (waiting for its copy): nothing due
            if was is None and known_all_present is not None:
                if unrenamed is None:
                    unrenamed = known_all_present()
                if unrenamed:
                    continue  # a table published since the last refresh: not this subscription's yet
            due = span.due_from(since if target is None else target.position)
            if due is not None:
                problems.append((due, _renamed_error(span, was, due)))
    for span in spans:
        target = target_of.get(span.name)
        due = None if target is None else span.due_from(target.position)
        if target is None or due is None:
            continue
        for epoch, rules in enumerate(target.rules):
            if rules is None or not _overlaps(epochs.starts, epoch, due, span.last_commit_lsn):
                continue
            needed = dict.fromkeys((*rules.column_types, *(rules.columns or ())))
            lost = [c for c in needed if c not in span.column_names]
            if lost:
                at = span.due_from(max(due, epochs.starts[epoch]) if epoch else due)
                assert at is not None  # _overlaps: the epoch starts at or before the span's last commit
                problems.append((at, _lost_column_error(span, target, lost[0], rules, at)))
                break
    if problems:
        raise min(problems, key=lambda p: p[0])[1]


def _overlaps(starts: Sequence[int], epoch: int, low: int, high: int) -> bool:
    """Whether epoch ``epoch`` (from its start to the next one's; epoch 0 also before) meets [low, high]."""
    begins = starts[epoch] if epoch else None
    ends = starts[epoch + 1] if epoch + 1 < len(starts) else None
    return (begins is None or begins <= high) and (ends is None or ends > low)


def _first_change(span: RelationSpan, due: int) -> str:
    return (f"first change at LSN {format_lsn(span.first_lsn)}, in the transaction finished at {format_lsn(due)}"
            if due == span.first_commit_lsn else f"a change in the transaction finished at {format_lsn(due)}")


def _renamed_error(span: RelationSpan, was: TableName | None, due: int) -> RelationChangedError:
    name = span.name
    if was is not None:
        hint = (f"the publisher's table {was} was renamed to {name} (OID {span.oid}). Either rename it back on the "
                f"publisher (ALTER TABLE {name} RENAME TO {was.name}) and run `rowfilter resync --table {was} "
                f"--copy`; or follow the new name: create {name} in the subscriber, run `rowfilter refresh` (the "
                f"publication lists the table by OID, so it now publishes {name}) and `rowfilter snapshot`. Either "
                "way the changes made under the new name reach the subscriber through the copy")
    else:
        hint = (f"the subscription's definitions know no table {name} (OID {span.oid}): a subscribed table renamed or "
                "moved on the publisher. Rename it back on the publisher and run `rowfilter resync --table <its "
                "name> --copy`, or create it in the subscriber and run `rowfilter refresh` and `rowfilter snapshot`")
    return RelationChangedError(
        f'logical replication target relation "{name}" does not exist',
        lsn=due, table=str(was or name),
        detail=f"The change log holds changes of the publisher's relation {name} ({_first_change(span, due)}); "
        "the subscription's definitions name no such table. Nothing of the batch was applied.",
        hint=hint)


def _lost_column_error(span: RelationSpan, target: TargetPlan, column: str, rules: EpochRules,
                       at: int) -> RelationChangedError:
    reads = "row filter" if column in rules.column_types else "column list"
    return RelationChangedError(
        f'logical replication source relation "{span.name}" is missing column "{column}" read by the '
        f"subscription's {reads}",
        lsn=at, table=str(target.table),
        detail=f"The publisher's changes ({_first_change(span, at)}) carry the columns "
        f"({', '.join(span.column_names)}): the column was renamed or dropped on the publisher, and judging the "
        "changes by the old name would drop them as filtered. Nothing of the batch was applied.",
        hint=f'make the definitions match the publisher: rename "{column}" back on the publisher, or run '
        f"`rowfilter refresh` so they read the new name; then run `rowfilter resync --table {target.table} --copy`: "
        "the changes logged in between reach the table through the copy, and the apply goes on after it")


@dataclass(frozen=True)
class IdentitySpan:
    """UPDATEs or DELETEs of one table in a change-log segment, logged under one replica identity and key."""

    schema: str
    table: str
    kind: str  # update or delete
    replica_identity: str  # relreplident: d, n, f, i
    key: tuple[str, ...]  # the columns pgoutput flagged as the identity's (every column under FULL)
    first_commit_lsn: int
    last_commit_lsn: int
    first_lsn: int

    def due_from(self, position: int) -> int | None:
        """The commit LSN of a change of this span at or after ``position`` (the first when known), else None."""
        if self.last_commit_lsn < position:
            return None
        return self.first_commit_lsn if self.first_commit_lsn >= position else self.last_commit_lsn


_IDENTITY_NAMES = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}


def check_identities(plan: ApplyPlan, epochs: Epochs, read_spans: Callable[[], Sequence[IdentitySpan]]) -> None:
    """Stop the batch at an UPDATE or DELETE PostgreSQL would have refused on the publisher.

    For definitions the publisher does not know (a publications file), the publisher cannot run
    ``CheckCmdReplicaIdentity`` (src/backend/executor/execReplication.c): a replica identity switched
    after the refresh that no longer covers an action's row filter (``pub_rf_contains_invalid_column``)
    or is not covered by its column list (``pub_contains_invalid_column``, src/backend/commands/
    publicationcmds.c) lets UPDATEs and DELETEs through whose old row lacks what the filter reads:
    judged anyway they would diverge silently. PostgreSQL refuses such a change where it is made;
    the apply refuses it where it is judged, with PostgreSQL's message.

    ``read_spans`` (the batch's UPDATEs and DELETEs by identity, change_log/segment_reader.py ``segment_identities``) is
    called only when some table's definitions read an old row: an UPDATE or DELETE filter, or a column list.

    :raises RelationChangedError: the first such change in commit order.
    """
    if not any(rules is not None and (rules.columns is not None or rules.filters.get("update") is not None
                                      or rules.filters.get("delete") is not None)
               for t in plan.targets for rules in t.rules):
        return
    target_of = {leaf: t for t in plan.targets for leaf in t.leaves}
    problems: list[tuple[int, RelationChangedError]] = []
    for span in read_spans():
        target = target_of.get(TableName(span.schema, span.table))
        due = None if target is None else span.due_from(target.position)
        if target is None or due is None:
            continue
        for epoch, rules in enumerate(target.rules):
            if rules is None or span.kind not in rules.actions or \
                    not _overlaps(epochs.starts, epoch, due, span.last_commit_lsn):
                continue
            tree = rules.filters.get(span.kind)
            read = sorted({c.name for c in tree.find_all(exp.Column)}) if tree is not None else []
            key = set(span.key)
            detail = None
            if span.replica_identity != "f" and not key >= set(read):
                detail = "Column used in the publication WHERE expression is not part of the replica identity."
            elif rules.columns is not None and not set(rules.columns) >= key:
                detail = "Column list used by the publication does not cover the replica identity."
            if detail is not None:
                at = span.due_from(max(due, epochs.starts[epoch]) if epoch else due)
                assert at is not None
                problems.append((at, _identity_error(span, target, detail, at)))
                break
    if problems:
        raise min(problems, key=lambda p: p[0])[1]


def _identity_error(span: IdentitySpan, target: TargetPlan, detail: str, at: int) -> RelationChangedError:
    verb = "update" if span.kind == "update" else "delete from"
    identity = _IDENTITY_NAMES.get(span.replica_identity, span.replica_identity)
    first = (f"first at LSN {format_lsn(span.first_lsn)}, in the transaction finished at {format_lsn(at)}"
             if at == span.first_commit_lsn else f"one in the transaction finished at {format_lsn(at)}")
    return RelationChangedError(
        f'cannot {verb} table "{span.table}"', lsn=at, table=str(target.table),
        detail=f"{detail} The publisher logged {span.kind.upper()}s of {span.schema}.{span.table} ({first}) under "
        f"REPLICA IDENTITY {identity} (key: {', '.join(span.key) or 'none'}): the publications file's definitions "
        "are not known to the publisher, which could not refuse them as PostgreSQL does, and their old rows lack "
        "what the definitions read. Nothing of the batch was applied.",
        hint=f"set the replica identity back on the publisher (ALTER TABLE {span.schema}.{span.table} REPLICA "
        "IDENTITY FULL), or make the file's filter and column list fit the new identity and run `rowfilter "
        f"refresh`; then run `rowfilter resync --table {target.table} --copy`: the changes that cannot be judged "
        "are replaced by a new copy, and the apply goes on after it")
