"""One table compared with its publisher: the plan, the bucket pass on both sides, the rows of the differing buckets.

What ``rowfilter verify`` and ``rowfilter reconcile`` share (flows/verify/verify.py, reconcile.py). The
statements are core/compare/table_compare.py's; each side runs its own (publisher/compare_source.py,
subscriber/compare_target.py); an *engine* runs the reads: the job's own threads for a table of a few
readers (:class:`LocalEngine`: no Spark session is started for it, as the initial copy copies a table of one
reader without Spark), Spark tasks otherwise (spark/compare_frames.py), where the rows of the differing
buckets are matched by a join that spills instead of the driver's memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack, closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import psycopg

from airflow_provider_rowfilter.core.compare.table_compare import (
    GROUP_ROWS,
    HASH_PROBE,
    Buckets,
    CompareShape,
    HashBuckets,
    RangeBuckets,
    RowDiff,
    TableCheck,
    add_sums,
    bucket_count,
    bucket_sums_sql,
    diff_keyed,
    diff_multiset,
    differing_buckets,
    groups,
    keyed_rows_sql,
    multiset_rows_sql,
    record_hash_probe,
)
from airflow_provider_rowfilter.core.publication.subscription_filters import TableFilters
from airflow_provider_rowfilter.core.relation import Relation
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.publisher.compare_source import (
    READER_PAGES,
    Read,
    all_rows,
    estimated_rows,
    key_bounds,
    read_rows,
    reader_predicates,
    rows_select,
)
from airflow_provider_rowfilter.publisher.copy_source import (
    CopySource,
    ExportedSnapshot,
    copy_out_sql,
    read_copy,
    table_pages,
)
from airflow_provider_rowfilter.subscriber.compare_target import CompareTarget, compare_target, shape_of
from airflow_provider_rowfilter.subscriber.reconcile_target import GroupCounts, GroupFix, fix_group

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: A table whose larger side has more blocks than this is compared by Spark tasks (when the job may start Spark).
LOCAL_PAGES = 4 * READER_PAGES
#: How many times larger a reconcile's groups are where the buckets are hashes of the key (fewer scans).
HASHED_GROUP_FACTOR = 10
#: Rows of the differing buckets (the larger side's) up to which they are matched, or fixed, by the job itself:
#: a few ranges of a large table need no Spark task (what the driver holds is bounded by this).
LOCAL_ROWS = 200_000


# --- engines --------------------------------------------------------------------------------------------
class Engine(Protocol):
    def sums(self, reads: Sequence[Read]) -> list[list[tuple]]: ...
    def diff(self, publisher: Sequence[Read], subscriber: Sequence[Read], keyed: bool) -> RowDiff: ...
    def fixes(self, source: dict[str, str], snapshot: ExportedSnapshot, target: dict[str, str],
              fixes: Sequence[GroupFix], each: Callable[[GroupCounts], None]) -> None: ...


class LocalEngine:
    """The reads and the fixes in the job's own threads (two at once: one per side, or two groups)."""

    def __init__(self, threads: int = 2) -> None:
        self.threads = threads

    def sums(self, reads: Sequence[Read]) -> list[list[tuple]]:
        with ThreadPoolExecutor(self.threads, thread_name_prefix="rowfilter-compare") as pool:
            return list(pool.map(all_rows, reads))

    def diff(self, publisher: Sequence[Read], subscriber: Sequence[Read], keyed: bool) -> RowDiff:
        def rows(reads: Sequence[Read]) -> list[tuple]:
            return [r for read in reads for rows in read_rows(read) for r in rows]

        with ThreadPoolExecutor(2, thread_name_prefix="rowfilter-compare") as pool:
            theirs, ours = pool.submit(rows, publisher), pool.submit(rows, subscriber)
            pub_rows, sub_rows = theirs.result(), ours.result()
        if keyed:
            return diff_keyed(pub_rows, sub_rows)
        # Several readers of one side may each hold copies of a row: add their counts up first.
        return diff_multiset(_summed(pub_rows), _summed(sub_rows))

    def fixes(self, source: dict[str, str], snapshot: ExportedSnapshot, target: dict[str, str],
              fixes: Sequence[GroupFix], each: Callable[[GroupCounts], None]) -> None:
        # Each group's transaction touches only its own key ranges: two at once never wait for each other.
        with ThreadPoolExecutor(self.threads, thread_name_prefix="rowfilter-reconcile") as pool:
            for done in as_completed([pool.submit(fix_from_publisher, source, snapshot, target, fix) for fix in fixes]):
                each(done.result())


def fix_from_publisher(source: dict[str, str], snapshot: ExportedSnapshot, target: dict[str, str],
                       fix: GroupFix) -> GroupCounts:
    """One group's fix: the publisher's rows of the group, read in ``snapshot`` (publisher/copy_source.py
    ``read_copy``), streamed into the subscriber's transaction that fixes it (subscriber/reconcile_target.py)."""
    with closing(read_copy(source, fix.copy_out, snapshot)) as blocks:
        return fix_group(target, fix, blocks)


def _summed(rows: Sequence[tuple]) -> list[tuple[str, int]]:
    totals: dict[str, int] = {}
    for row, n in rows:
        totals[row] = totals.get(row, 0) + int(n)
    return list(totals.items())


class SparkEngine:
    """The reads, the match of the differing rows and the fixes as Spark tasks (spark/compare_frames.py)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def sums(self, reads: Sequence[Read]) -> list[list[tuple]]:
        from airflow_provider_rowfilter.spark.compare_frames import run_reads

        return run_reads(self.spark, reads)

    def diff(self, publisher: Sequence[Read], subscriber: Sequence[Read], keyed: bool) -> RowDiff:
        from airflow_provider_rowfilter.spark.compare_frames import diff_rows

        return diff_rows(self.spark, publisher, subscriber, keyed)

    def fixes(self, source: dict[str, str], snapshot: ExportedSnapshot, target: dict[str, str],
              fixes: Sequence[GroupFix], each: Callable[[GroupCounts], None]) -> None:
        from airflow_provider_rowfilter.spark.compare_frames import run_fixes

        for counts in run_fixes(self.spark, source, snapshot, target, fixes):
            each(counts)


class Engines(ExitStack):
    """The job's engines: the local one, and Spark's, started the first time a table is large enough."""

    def __init__(self, spec: SubscriptionSpec, job: str, spark: SparkSession | None, *,
                 local_pages: int | None = None) -> None:
        super().__init__()
        self.spec, self.job, self.given = spec, job, spark
        self.local_pages = LOCAL_PAGES if local_pages is None else local_pages
        self.session: SparkSession | None = None

    def for_pages(self, pages: int) -> Engine:
        if pages <= self.local_pages:
            return LocalEngine()
        return SparkEngine(self.spark())

    def for_rows(self, rows: int, engine: Engine) -> Engine:
        """``engine``, or the local one for the rows of a few differing ranges."""
        return LocalEngine() if rows <= LOCAL_ROWS and self.local_pages > 0 else engine

    def spark(self) -> SparkSession:
        if self.session is None:
            from airflow_provider_rowfilter.spark.session import job_session

            self.session = self.enter_context(job_session(self.spec, self.job, self.given))
        return self.session


# --- one table ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sides:
    """The connection parameters of both sides' readers and the snapshots they read in (None: read committed)."""

    publisher: dict[str, str]
    subscriber: dict[str, str]
    publisher_snapshot: ExportedSnapshot
    subscriber_snapshot: ExportedSnapshot | None

    def read(self, side: str, statement: str) -> Read:
        if side == "publisher":
            return Read(side, self.publisher, self.publisher_snapshot, statement)
        return Read(side, self.subscriber, self.subscriber_snapshot, statement)


@dataclass(frozen=True)
class TablePlan:
    """How one table is compared: its shape, both sides' rows as SELECTs, the buckets, the bucket pass's readers."""

    shape: CompareShape
    source: CopySource  # the publisher's rows (the initial copy's)
    target: CompareTarget  # the subscriber's
    target_source: CopySource  # the subscriber's rows as a SELECT of the published columns (no filter)
    buckets: Buckets
    publisher_readers: tuple[str | None, ...]
    subscriber_readers: tuple[str | None, ...]
    pages: int  # the larger side's blocks: what chooses the engine

    def publisher_rows(self, predicate: str | None) -> str:
        return rows_select(self.source, predicate)

    def subscriber_rows(self, predicate: str | None) -> str:
        return rows_select(self.target_source, predicate)


def plan_table(pub: psycopg.Connection, sub: psycopg.Connection, subscription: str, filters: TableFilters,
               relation: Relation, *, max_readers: int, rerun: str) -> TablePlan:
    """Plan one table's comparison from its effective copy filter and columns (the initial copy's own source)."""
    from airflow_provider_rowfilter.publisher.copy_source import copy_source

    source = copy_source(filters, relation)
    target = compare_target(sub, subscription, filters.table, source.columns, rerun=rerun)
    target_source = CopySource(filters.table, source.columns, None, only=target.target.relkind != "p")
    types = {c.name: c.type_name for c in relation.columns}
    shape = shape_of(filters.table, source.columns, types, target,
                     record_hashing=record_hashing(pub, sub, source.columns, types))
    rows = max(estimated_rows(pub, source), estimated_rows(sub, target_source))
    buckets: Buckets
    if shape.integer_key:
        bounds = [b for b in (key_bounds(pub, source, shape.key[0]), key_bounds(sub, target_source, shape.key[0]))
                  if b is not None]
        lower, upper = (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (0, 0)
        buckets = RangeBuckets.spanning(shape.key[0], lower, upper, rows)
    else:
        buckets = HashBuckets(shape.key or shape.columns, shape.hashing, bucket_count(rows))
    pages = max(table_pages(pub, source), table_pages(sub, target_source))
    return TablePlan(shape, source, target, target_source, buckets, tuple(reader_predicates(pub, source, max_readers)),
                     tuple(reader_predicates(sub, target_source, max_readers)), pages)


def record_hashing(pub: psycopg.Connection, sub: psycopg.Connection, columns: Sequence[str],
                   types: dict[str, str]) -> bool:
    """Whether both sides can hash the rows with ``hash_record_extended`` and hash alike (core/compare/table_compare.py)."""
    probes = []
    for conn in (pub, sub):
        if conn.info.server_version < 140000:
            return False
        try:
            with conn.transaction():
                conn.execute(record_hash_probe(columns, types))
                probes.append(conn.execute(HASH_PROBE).fetchone()[0])
        except psycopg.Error:  # a type without an extended hash function (json, point, …)
            return False
    return probes[0] == probes[1]


@dataclass
class BucketPass:
    """Both sides' ``(rows, sum)`` per bucket."""

    publisher: dict[int, tuple[int, int]]
    subscriber: dict[int, tuple[int, int]]

    @property
    def differing(self) -> list[int]:
        return differing_buckets(self.publisher, self.subscriber)

    def sizes(self) -> dict[int, int]:
        """The most rows either side has in each bucket."""
        return {b: max(self.publisher.get(b, (0, 0))[0], self.subscriber.get(b, (0, 0))[0])
                for b in set(self.publisher) | set(self.subscriber)}

    @property
    def differing_rows(self) -> int:
        """The rows of the differing buckets (the larger side's): what the row match or the fixes read."""
        sizes = self.sizes()
        return sum(sizes.get(b, 0) for b in self.differing)


def bucket_pass(plan: TablePlan, sides: Sides, engine: Engine) -> BucketPass:
    """Hash every row of both sides into its bucket, in the databases, every reader at once."""
    reads = [sides.read("publisher", bucket_sums_sql(plan.shape, plan.buckets, plan.publisher_rows(p)))
             for p in plan.publisher_readers]
    reads += [sides.read("subscriber", bucket_sums_sql(plan.shape, plan.buckets, plan.subscriber_rows(p)))
              for p in plan.subscriber_readers]
    results = engine.sums(reads)
    found = BucketPass({}, {})
    for read, rows in zip(reads, results, strict=True):
        add_sums(found.publisher if read.side == "publisher" else found.subscriber, rows)
    return found


def group_predicates(plan: TablePlan, found: BucketPass, group_rows: int = GROUP_ROWS) -> list[str]:
    """The differing buckets as groups of at most about ``group_rows`` rows, each one predicate over the key (or row)."""
    return [plan.buckets.predicate(g) for g in groups(found.differing, found.sizes(), group_rows)]


def row_diff(plan: TablePlan, sides: Sides, found: BucketPass, engine: Engine) -> RowDiff:
    """The rows of the differing buckets, matched: missing, extra, different, with examples."""
    differing = found.differing
    if not differing:
        return RowDiff()
    rows_sql = keyed_rows_sql if plan.shape.keyed else multiset_rows_sql
    if isinstance(plan.buckets, RangeBuckets):  # index ranges: one read per group on each side
        theirs = ours = group_predicates(plan, found)
    else:  # a hash needs a scan: one pass of each side's readers over every differing bucket
        chosen = plan.buckets.predicate(differing)
        theirs = [_both(chosen, r) for r in plan.publisher_readers]
        ours = [_both(chosen, r) for r in plan.subscriber_readers]
    publisher = [sides.read("publisher", rows_sql(plan.shape, plan.publisher_rows(p))) for p in theirs]
    subscriber = [sides.read("subscriber", rows_sql(plan.shape, plan.subscriber_rows(p))) for p in ours]
    return engine.diff(publisher, subscriber, plan.shape.keyed)


def _both(predicate: str, reader: str | None) -> str:
    return predicate if reader is None else f"{predicate} AND {reader}"


def group_fixes(plan: TablePlan, found: BucketPass, group_rows: int = GROUP_ROWS) -> list[GroupFix]:
    """One fix per group of differing buckets: the publisher's COPY of the group's rows, the target's predicate."""
    fixes = []
    if isinstance(plan.buckets, HashBuckets):  # no index finds a hashed range: each group scans both sides once
        group_rows *= HASHED_GROUP_FACTOR
    for i, chosen in enumerate(groups(found.differing, found.sizes(), group_rows)):
        predicate = plan.buckets.predicate(chosen)
        fixes.append(GroupFix(plan.target.target.table, plan.target.target.relkind == "p", plan.source.columns,
                              plan.shape.key, copy_out_sql(plan.source, predicate=predicate), predicate,
                              plan.buckets.predicate(chosen, "t"), i))
    return fixes


def check_of(plan: TablePlan, found: BucketPass, lsn: str | None, kind: str = "verify") -> TableCheck:
    """The table's check record so far: the rows and buckets of the pass."""
    return TableCheck(str(plan.shape.table), lsn=lsn, publisher_rows=sum(c for c, _ in found.publisher.values()),
                      subscriber_rows=sum(c for c, _ in found.subscriber.values()),
                      rows=sum(c for c, _ in found.publisher.values()) + sum(c for c, _ in found.subscriber.values()),
                      buckets=plan.buckets.count, differing_buckets=len(found.differing),
                      compared=plan.shape.describe(), kind=kind)
