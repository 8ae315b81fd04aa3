"""How a subscriber table is compared with its publisher's rows: buckets, the hashes the databases compute, what differs.

Both sides run the same SQL over the same columns (the table's published columns, in the publisher's
order), so each database hashes its own rows and only small aggregates travel (docs/verify.md):

1. **Buckets.** Every row falls into one bucket, by its key: ranges of a single integer key
   (:class:`RangeBuckets`: an index range scan reads one), else a hash of the key (:class:`HashBuckets`); a
   table without a usable key is compared as a multiset of rows, bucketed by the hash of the whole row.
   Per bucket each side returns its row count and the sum of its rows' 64-bit hashes: equal pairs mean
   equal rows (a sum, not a XOR, so a row present twice counts twice). A row's hash is
   ``hash_record_extended`` (PostgreSQL 14+, each column's own extended hash function, as hash
   partitioning uses) where both sides have the same column types, hash them and agree on a probe row
   (:data:`HASH_PROBE`); else the ``md5`` of the row's text form, the same on PostgreSQL 10 to 18 and on
   any CPU (:class:`Hashing`).
2. **Rows.** Only inside the buckets that differ are rows read: key and row hash (or the row's text
   and its count, for a multiset), and the two sides matched by key.

A value is compared by its text form, as ``COPY`` carries it; both sides' sessions are set to the same
output settings (:data:`SESSION_SETTINGS`). Nothing here touches a database: the statements are text, run
by publisher/compare_source.py and subscriber/compare_target.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from airflow_provider_rowfilter.core.relation import TableName

#: The output settings of every comparing session, on both sides: what the text form of a date, time,
#: interval, float or bytea depends on (capture's own: publisher/capture.py).
SESSION_SETTINGS = ("SET DateStyle = 'ISO, MDY'", "SET IntervalStyle = 'postgres'", "SET extra_float_digits = 3",
                    "SET bytea_output = 'hex'", "SET TimeZone = 'UTC'")
#: Rows per bucket aimed at; at most :data:`MAX_BUCKETS` buckets.
BUCKET_ROWS = 4096
MAX_BUCKETS = 1 << 16
#: Rows of the differing buckets read (and, for a reconcile, fixed in one subscriber transaction) together.
GROUP_ROWS = 100_000
#: Example keys kept per kind of difference.
EXAMPLES = 10
INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})
#: Within this, ``key - lower`` cannot overflow a bigint.
_SAFE = 1 << 62


def ident(name: str) -> str:
    """A column name as a quoted SQL identifier (always quoted: a keyword is a valid column name)."""
    return '"' + name.replace('"', '""') + '"'


def _row(columns: Sequence[str], alias: str | None = None) -> str:
    return f"ROW({_refs(columns, alias)})::text"


def _refs(columns: Sequence[str], alias: str | None = None) -> str:
    """The columns as SQL references, qualified by ``alias`` (a statement that reads two tables)."""
    return ", ".join(f"{alias}.{ident(c)}" if alias else ident(c) for c in columns)


#: What both sides hash before the record hashing is chosen: the same value on both, or the text hashing is used.
HASH_PROBE = ("SELECT hash_record_extended(ROW(1::int8, 'probe'::text, 1.5::numeric, "
              "'2025-01-01 00:00:00+00'::timestamptz, true, 2.5::float8, 'probe'::bytea), 0)")


class Hashing:
    """How a row or a key is hashed: ``record`` (``hash_record_extended``) or ``text`` (``md5`` of its text form)."""

    RECORD = "record"
    TEXT = "text"


@dataclass(frozen=True)
class CompareShape:
    """What is compared of one table: ``columns`` (the published ones, the publisher's order) and ``key``
    (the subscriber's key, all published; empty: the rows are compared as a multiset)."""

    table: TableName
    columns: tuple[str, ...]
    key: tuple[str, ...] = ()
    integer_key: bool = False  # a single smallint/integer/bigint key on both sides: buckets are its ranges
    hashing: str = Hashing.TEXT

    @property
    def keyed(self) -> bool:
        return bool(self.key)

    @property
    def row_text(self) -> str:
        return _row(self.columns)

    @property
    def key_text(self) -> str:
        return _row(self.key) if self.key else self.row_text


    def describe(self) -> str:
        how = "" if self.hashing == Hashing.RECORD else ", hashed as text"
        if not self.key:
            return f"as a multiset of rows (no key){how}"
        return f"by key ({', '.join(self.key)}){how}"


def compare_shape(table: TableName, columns: Sequence[str], subscriber_key: Sequence[str],
                  publisher_types: Mapping[str, str], subscriber_types: Mapping[str, str],
                  record_hashing: bool = False) -> CompareShape:
    """The shape of a comparison: the subscriber's key when every column of it is published, else none; the
    record hashing when ``record_hashing`` (both sides can) and every column has the same type on both sides."""
    key = tuple(subscriber_key) if subscriber_key and set(subscriber_key) <= set(columns) else ()
    integer = (len(key) == 1 and publisher_types.get(key[0]) in INTEGER_TYPES
               and subscriber_types.get(key[0]) in INTEGER_TYPES)
    same = all(publisher_types.get(c) is not None and publisher_types.get(c) == subscriber_types.get(c) for c in columns)
    return CompareShape(table, tuple(columns), key, integer, Hashing.RECORD if record_hashing and same else Hashing.TEXT)


def record_hash_probe(columns: Sequence[str], types: Mapping[str, str]) -> str:
    """A statement that fails unless every column's type has an extended hash function (hash_record_extended
    looks each one up before it looks at the values: rowtypes.c)."""
    return "SELECT hash_record_extended(ROW(" + ", ".join(f"NULL::{types[c]}" for c in columns) + "), 0)"


# --- buckets -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RangeBuckets:
    """Buckets of equal width of a single integer key: bucket ``i`` is ``[lower + i*stride, lower + (i+1)*stride)``,
    the first and the last open-ended."""

    column: str
    lower: int
    stride: int
    count: int

    @classmethod
    def spanning(cls, column: str, lower: int, upper: int, rows: int) -> RangeBuckets:
        """Buckets over ``[lower, upper]`` for about ``rows`` rows."""
        count = bucket_count(rows)
        stride = max(1, math.ceil((upper - lower + 1) / count))
        return cls(column, lower, stride, max(1, min(count, math.ceil((upper - lower + 1) / stride))))

    def bucket_sql(self, alias: str | None = None) -> str:
        k = _refs([self.column], alias)
        if abs(self.lower) < _SAFE and abs(self.lower + self.stride * self.count) < _SAFE:
            offset = f"({k}::int8 - {self.lower}) / {self.stride}"
        else:
            offset = f"div({k}::numeric - {self.lower}, {self.stride})"
        # A NULL key (the subscriber's key need not be one on the publisher) goes with the first bucket.
        return f"coalesce(least(greatest({offset}, 0), {self.count - 1}), 0)::int4"

    def predicate(self, buckets: Iterable[int], alias: str | None = None) -> str:
        """The rows of ``buckets``, as ranges of the key an index serves (consecutive buckets merged)."""
        k = _refs([self.column], alias)
        parts = []
        for first, last in runs(buckets):
            lower = None if first == 0 else self.lower + first * self.stride
            upper = None if last == self.count - 1 else self.lower + (last + 1) * self.stride
            bounds = [b for b in (None if lower is None else f"{k} >= {lower}",
                                  None if upper is None else f"{k} < {upper}") if b]
            part = " AND ".join(bounds) if bounds else "TRUE"
            parts.append(f"{part} OR {k} IS NULL" if first == 0 and bounds else part)
        return "(" + " OR ".join(f"({p})" for p in parts) + ")" if parts else "FALSE"


@dataclass(frozen=True)
class HashBuckets:
    """Buckets by a non-negative 31-bit hash of the key (of the whole row, for a multiset): ``count`` of them."""

    columns: tuple[str, ...]  # the key's (the row's)
    hashing: str
    count: int

    def bucket_sql(self, alias: str | None = None) -> str:
        refs = _refs(self.columns, alias)
        if self.hashing == Hashing.RECORD:
            hashed = f"(hash_record_extended(ROW({refs}), 1) & 2147483647)"
        else:
            hashed = f"(('x' || substr(md5(ROW({refs})::text), 16, 8))::bit(32)::int8 & 2147483647)"
        return f"({hashed} % {self.count})::int4"

    def predicate(self, buckets: Iterable[int], alias: str | None = None) -> str:
        chosen = sorted(set(buckets))
        if not chosen:
            return "FALSE"
        if len(chosen) == self.count:
            return "TRUE"
        return f"{self.bucket_sql(alias)} = ANY ('{{{','.join(map(str, chosen))}}}'::int4[])"


Buckets = RangeBuckets | HashBuckets


def bucket_count(rows: int) -> int:
    return max(1, min(MAX_BUCKETS, math.ceil(max(rows, 1) / BUCKET_ROWS)))


def runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive integers as ``(first, last)`` runs."""
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


# --- the statements --------------------------------------------------------------------------------------
def row_hash_sql(shape: CompareShape) -> str:
    """A row's hash: ``hash_record_extended``, or the first 15 hex digits (60 bits) of the md5 of its text form."""
    if shape.hashing == Hashing.RECORD:
        return f"hash_record_extended(ROW({', '.join(map(ident, shape.columns))}), 0)"
    return f"('x' || substr(md5({shape.row_text}), 1, 15))::bit(60)::int8"


def bucket_sums_sql(shape: CompareShape, buckets: Buckets, rows: str) -> str:
    """Per bucket: ``(bucket, rows, sum of row hashes)`` of the rows ``rows`` (a SELECT of the published columns)."""
    return (f"SELECT b, count(*), sum(h)::text FROM (SELECT {buckets.bucket_sql()} AS b, {row_hash_sql(shape)} AS h "
            f"FROM ({rows}) s) z GROUP BY b")


def keyed_rows_sql(shape: CompareShape, rows: str) -> str:
    """``(key text, row hash)`` of each row of ``rows``."""
    return f"SELECT {shape.key_text}, {row_hash_sql(shape)} FROM ({rows}) s"


def multiset_rows_sql(shape: CompareShape, rows: str) -> str:
    """``(row text, how many)`` of ``rows``: a table without a key compared as a multiset."""
    return f"SELECT {shape.row_text}, count(*) FROM ({rows}) s GROUP BY 1"


# --- what differs ---------------------------------------------------------------------------------------
def add_sums(into: dict[int, tuple[int, int]], rows: Iterable[Sequence]) -> dict[int, tuple[int, int]]:
    """Add one read's ``(bucket, count, sum)`` rows into ``into`` (several readers share a table's buckets)."""
    for bucket, count, total in rows:
        c, s = into.get(int(bucket), (0, 0))
        into[int(bucket)] = (c + int(count), s + int(total))
    return into


def differing_buckets(publisher: Mapping[int, tuple[int, int]], subscriber: Mapping[int, tuple[int, int]]) -> list[int]:
    return sorted(b for b in set(publisher) | set(subscriber) if publisher.get(b) != subscriber.get(b))


def groups(buckets: Sequence[int], sizes: Mapping[int, int], limit: int = GROUP_ROWS) -> list[list[int]]:
    """``buckets`` in order, packed into groups of at most ``limit`` rows by ``sizes`` (a bucket alone may pass it)."""
    out: list[list[int]] = []
    rows = 0
    for b in buckets:
        n = sizes.get(b, 0)
        if out and rows + n <= limit:
            out[-1].append(b)
            rows += n
        else:
            out.append([b])
            rows = n
    return out


@dataclass
class RowDiff:
    """What the rows of the differing buckets showed: counts, and up to :data:`EXAMPLES` keys (or rows) each."""

    missing: int = 0  # on the publisher, not on the subscriber
    extra: int = 0  # on the subscriber, not on the publisher
    different: int = 0  # on both, with other values
    examples: dict[str, list[str]] = field(default_factory=lambda: {"missing": [], "extra": [], "different": []})

    def add(self, other: RowDiff) -> None:
        self.missing += other.missing
        self.extra += other.extra
        self.different += other.different
        for kind, keys in other.examples.items():
            self.examples[kind] = sorted(self.examples[kind] + keys)[:EXAMPLES]

    @property
    def clean(self) -> bool:
        return not (self.missing or self.extra or self.different)


def diff_keyed(publisher: Iterable[Sequence], subscriber: Iterable[Sequence]) -> RowDiff:
    """Match ``(key, hash)`` rows of both sides by key (the rows of a group: bounded)."""
    theirs = {k: h for k, h in publisher}
    diff = RowDiff()
    for key, h in subscriber:
        other = theirs.pop(key, None)
        if other is None:
            diff.extra += 1
            _example(diff, "extra", key)
        elif other != h:
            diff.different += 1
            _example(diff, "different", key)
    diff.missing = len(theirs)
    for key in theirs:
        _example(diff, "missing", key)
    return _settled(diff)


def diff_multiset(publisher: Iterable[Sequence], subscriber: Iterable[Sequence]) -> RowDiff:
    """Match ``(row text, count)`` rows of both sides: surplus copies are extra, lacking ones missing."""
    theirs = {r: int(n) for r, n in publisher}
    diff = RowDiff()
    for row, n in subscriber:
        other = theirs.pop(row, 0)
        if int(n) > other:
            diff.extra += int(n) - other
            _example(diff, "extra", row)
        elif int(n) < other:
            diff.missing += other - int(n)
            _example(diff, "missing", row)
    for row, n in theirs.items():
        diff.missing += n
        _example(diff, "missing", row)
    return _settled(diff)


def _example(diff: RowDiff, kind: str, key: str) -> None:
    """Keep the smallest keys of each kind (as Spark's ``orderBy().limit()`` does), never more than a few dozen."""
    kept = diff.examples[kind]
    kept.append(key)
    if len(kept) > 4 * EXAMPLES:
        kept.sort()
        del kept[EXAMPLES:]


def _settled(diff: RowDiff) -> RowDiff:
    for kept in diff.examples.values():
        kept.sort()
        del kept[EXAMPLES:]
    return diff


@dataclass
class TableCheck:
    """One table's verify (or reconcile): what ``status``, the XCom and the state keep of it."""

    table: str
    lsn: str | None = None  # the consistent point both sides were compared at
    rows: int = 0  # rows compared: the publisher's under the copy filter plus the subscriber's
    publisher_rows: int = 0
    subscriber_rows: int = 0
    buckets: int = 0
    differing_buckets: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    compared: str = ""  # CompareShape.describe()
    note: str | None = None  # why it was not compared
    kind: str = "verify"  # or "reconcile"
    inserted: int = 0  # reconcile: rows written
    updated: int = 0
    deleted: int = 0
    #: Other subscriptions replicating into the same table: its extra rows may be theirs (docs/verify.md).
    shared_with: list[str] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        return self.note is None

    @property
    def clean(self) -> bool:
        return self.checked and not (self.missing or self.extra or self.different)

    def take(self, diff: RowDiff) -> None:
        self.missing, self.extra, self.different = diff.missing, diff.extra, diff.different
        self.examples = {k: v for k, v in diff.examples.items() if v}

    def as_dict(self) -> dict:
        return {**asdict(self), "clean": self.clean}

    def describe(self) -> str:
        """One line for a person."""
        if not self.checked:
            return f"{self.table}: not compared: {self.note}"
        where = f"at {self.lsn}" if self.lsn else ""
        head = (f"{self.table}: {self.publisher_rows:,} publisher rows, {self.subscriber_rows:,} subscriber rows "
                f"compared {self.compared} {where} in {self.buckets:,} ranges ({self.seconds:.1f} s)")
        if self.kind == "reconcile":
            return (f"{head}: inserted {self.inserted:,}, updated {self.updated:,}, deleted {self.deleted:,}"
                    + ("" if self.inserted or self.updated or self.deleted else " (it was equal)"))
        if self.clean:
            return f"{head}: equal"
        parts = [f"{n:,} {word}" for n, word in ((self.missing, "missing"), (self.extra, "extra"),
                                                  (self.different, "different")) if n]
        lines = [f"{head}: {', '.join(parts)} in {self.differing_buckets:,} ranges"]
        for kind, keys in self.examples.items():
            lines.append(f"  {kind}: {', '.join(keys)}" + (" …" if len(keys) >= EXAMPLES else ""))
        if self.shared_with and self.extra:
            lines.append(f"  subscription(s) {', '.join(self.shared_with)} replicate into it too: the extra rows "
                         "may be theirs")
        return "\n".join(lines)
