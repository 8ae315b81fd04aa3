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

Before any of that, core/apply/relation_checks.py holds the relations the change log's segments carry
against these definitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp, serde

from airflow_provider_rowfilter.core.errors import UntranslatableFilterError
from airflow_provider_rowfilter.core.filters import pg_types
from airflow_provider_rowfilter.core.filters.spark_sql import NUMERIC_READS, decimal_read, numeric_channel_read
from airflow_provider_rowfilter.core.filters.spark_translation import typed_read
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.values import ConflictPolicy

DML = ("insert", "update", "delete")
#: A batch's bound unless the run sets one (``--max-changes``): the slot rows one capture reads, whole
#: transactions (publisher/capture.py), and about the changes one batch applies (flows/apply/batch_plan.py).
DEFAULT_MAX_CHANGES = 100_000


@dataclass(frozen=True)
class EpochRules:
    """One table's definitions in one epoch: what is published and with which filters and columns."""

    actions: frozenset[str]  # insert, update, delete, truncate
    filters: dict[str, exp.Expr | None]  # DML action -> Spark filter tree (None: unfiltered)
    columns: tuple[str, ...] | None  # the column list, None when there is none
    column_types: dict[str, str]  # format_type() of the columns the filters read
    #: the filters read numeric as its struct, NaN and the infinities carried (core/filters/spark_numeric.py);
    #: False for the filters of a document recorded before (``NUMERIC_READS``), which read a bare DECIMAL
    numeric_specials: bool = True

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
            numeric_specials=entry.get("numeric_reads") == NUMERIC_READS,
        )

    def publishes_column(self, name: str) -> bool:
        return self.columns is None or name in self.columns

    def renamed(self, old: str, new: str) -> EpochRules:
        """These definitions after ``ALTER TABLE … RENAME COLUMN old TO new`` on the publisher: PostgreSQL stores a
        publication's filter and column list by attribute number (``pg_publication_rel.prqual``, ``prattrs``), so
        they follow the rename; recorded by name, they are renamed here (apply/schema_follow.py)."""
        def rename(tree: exp.Expr | None) -> exp.Expr | None:
            if tree is None:
                return None
            tree = tree.copy()
            for column in tree.find_all(exp.Column):
                if column.name == old:
                    column.set("this", exp.Identifier(this=new, quoted=column.this.args.get("quoted", False)))
            return tree
        return replace(self, filters={a: rename(t) for a, t in self.filters.items()},
                       columns=None if self.columns is None else tuple(new if c == old else c for c in self.columns),
                       column_types={new if c == old else c: t for c, t in self.column_types.items()})


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
    """What a judged batch says before anything is staged (spark/apply_frames.py, flows/apply/net_effect.py)."""

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
                      read: Callable[[str], exp.Expr], *, numeric_specials: bool = True) -> exp.Expr:
    """The filter with each column reference replaced by ``read(name)`` cast to the column's Spark type.

    ``CAST(<read('a')> AS INT)``: the value's PostgreSQL text form, converted the way the
    differential tests check (an array's elements one by one, spark_translation.py ``typed_read``); a column
    the change does not carry reads as NULL. ``tree`` is not changed. Without ``numeric_specials`` (the filters of
    a document recorded before numeric's NaN and infinities were carried) a numeric column is read as the DECIMAL
    those filters compute with, and NaN or an infinity raises, naming the column and the fix (spark_sql.py
    ``decimal_read``).
    """

    def recorded(name: str) -> pg_types.PgType:
        type_name = column_types.get(name)
        pg_type = None if type_name is None else pg_types.parse_type(type_name)
        if pg_type is None or pg_types.spark_type(pg_type) is None:
            raise UntranslatableFilterError(
                f'the filter column "{name}" has no recorded type the apply can read it as',
                hint="run `rowfilter refresh` again so the definitions record the filter columns' types")
        return pg_type

    def typed(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Dot) and isinstance(node.this, exp.Column) and node.name in ("k", "v"):
            # one channel of a numeric column's struct (core/filters/spark_numeric.py), read from the text alone
            name = node.this.name
            return numeric_channel_read(read(name), recorded(name), node.name)
        if not isinstance(node, exp.Column):
            return node
        name = node.name
        pg_type = recorded(name)
        return typed_read(read(name), pg_type) if numeric_specials else decimal_read(read(name), pg_type, name)

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
