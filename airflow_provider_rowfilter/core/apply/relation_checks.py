"""The relations a batch's changes carry, held against the definitions the apply judges with (no database).

A change is judged by table and column *names*, so a change whose relation was renamed on the
publisher (or lost a column the definitions read), or whose replica identity no longer gives the old
row the definitions need, must stop the batch (:class:`RelationChangedError`), not be dropped as
"not subscribed" or "filtered". The change log's segments record each relation definition as
pgoutput announced it (:class:`RelationSpan`) and each replica identity (:class:`IdentitySpan`);
:func:`check_relations` and :func:`check_identities` read them against the epochs of
core/apply/plan.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from sqlglot import exp

from airflow_provider_rowfilter.core.apply.plan import ApplyPlan, EpochRules, Epochs, TargetPlan
from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.lsn import format_lsn, parse_lsn
from airflow_provider_rowfilter.core.relation import TableName


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
