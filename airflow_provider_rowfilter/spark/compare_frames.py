"""A table's comparison on Spark: the readers as tasks, the differing rows matched by a join, the fixes as tasks.

Each task opens its own connection and reads (or fixes) in the snapshot the driver holds
(publisher/compare_source.py ``read_rows``, subscriber/reconcile_target.py ``fix_group``); only the
DataFrame API is used, as in spark/copy_frames.py, so it runs the same through Spark Connect. The rows of
the differing buckets of both sides become two DataFrames joined by key: the match spills to disk where
it must, and the driver only collects the counts and a few example keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import asdict
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_rowfilter.core.compare.table_compare import EXAMPLES, RowDiff
from airflow_provider_rowfilter.publisher.compare_source import Read
from airflow_provider_rowfilter.publisher.copy_source import ExportedSnapshot
from airflow_provider_rowfilter.subscriber.reconcile_target import GroupCounts, GroupFix


def _run_each(spark: SparkSession, items: Sequence[Any], task: Callable[[Any], str]) -> list[str]:
    """``task(item)`` for each item, one Spark task each; their text results in the items' order."""
    if not items:
        return []
    items = list(items)

    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # on the executor

        schema = pa.schema([("i", pa.int64()), ("out", pa.string())])
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pydict({"i": [index], "out": [task(items[index])]}, schema=schema)

    rows = spark.range(0, len(items), 1, len(items)).mapInArrow(body, "i long, out string").collect()
    return [out for _, out in sorted((r["i"], r["out"]) for r in rows)]


def run_reads(spark: SparkSession, reads: Sequence[Read]) -> list[list[tuple]]:
    """Each read's rows (small results: bucket sums), one task per read."""
    from airflow_provider_rowfilter.publisher.compare_source import all_rows

    return [[tuple(r) for r in json.loads(out)] for out in _run_each(spark, reads, lambda r: json.dumps(all_rows(r)))]


def run_fixes(spark: SparkSession, source: dict[str, str], snapshot: ExportedSnapshot, target: dict[str, str],
              fixes: Sequence[GroupFix]) -> list[GroupCounts]:
    """Each group's fix, one task per group (a retried task redoes its group's fix: it changes nothing more)."""
    from airflow_provider_rowfilter.publisher.copy_source import read_copy
    from airflow_provider_rowfilter.subscriber.reconcile_target import fix_group

    def fix_one(fix: GroupFix) -> str:
        # The publisher's rows of the group, read in the snapshot, streamed into the subscriber's fix.
        with closing(read_copy(source, fix.copy_out, snapshot)) as blocks:
            return json.dumps(asdict(fix_group(target, fix, blocks)))

    outs = _run_each(spark, fixes, fix_one)
    return [GroupCounts(**json.loads(out)) for out in outs]


def _rows_frame(spark: SparkSession, reads: Sequence[Read], schema: str) -> DataFrame:
    """The rows of ``reads`` (each two columns) as one DataFrame, one partition per read."""
    reads = list(reads)

    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from airflow_provider_rowfilter.publisher.compare_source import read_rows

        names = [part.split()[0] for part in schema.split(",")]
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for rows in read_rows(reads[index]):
                    first, second = zip(*rows, strict=True)
                    yield pa.RecordBatch.from_pydict({names[0]: list(first), names[1]: [int(v) for v in second]})

    if not reads:
        return spark.createDataFrame([], schema)
    return spark.range(0, len(reads), 1, len(reads)).mapInArrow(body, schema)


def diff_rows(spark: SparkSession, publisher: Sequence[Read], subscriber: Sequence[Read], keyed: bool) -> RowDiff:
    """Match both sides' rows of the differing buckets: by key (``(key, hash)`` rows), or as multisets
    (``(row, count)`` rows, several readers' counts of one row added up)."""
    if keyed:
        pub = _rows_frame(spark, publisher, "k string, h long").alias("p")
        sub = _rows_frame(spark, subscriber, "k string, h long").alias("s")
        joined = pub.join(sub, F.col("p.k") == F.col("s.k"), "full_outer")
        kind = (F.when(F.col("s.k").isNull(), "missing").when(F.col("p.k").isNull(), "extra")
                .when(F.col("p.h") != F.col("s.h"), "different"))
        classified = joined.select(F.coalesce("p.k", "s.k").alias("k"), kind.alias("kind"), F.lit(1).alias("n"))
    else:
        pub = _rows_frame(spark, publisher, "k string, n long").groupBy("k").agg(F.sum("n").alias("n")).alias("p")
        sub = _rows_frame(spark, subscriber, "k string, n long").groupBy("k").agg(F.sum("n").alias("n")).alias("s")
        joined = pub.join(sub, F.col("p.k") == F.col("s.k"), "full_outer")
        delta = F.coalesce(F.col("p.n"), F.lit(0)) - F.coalesce(F.col("s.n"), F.lit(0))
        classified = joined.select(F.coalesce("p.k", "s.k").alias("k"),
                                   F.when(delta > 0, "missing").when(delta < 0, "extra").alias("kind"),
                                   F.abs(delta).alias("n"))
    classified = classified.where(F.col("kind").isNotNull()).persist()
    try:
        diff = RowDiff()
        for row in classified.groupBy("kind").agg(F.sum("n").alias("n")).collect():
            setattr(diff, row["kind"], int(row["n"]))
        for name in ("missing", "extra", "different"):
            if getattr(diff, name):
                diff.examples[name] = [r["k"] for r in classified.where(F.col("kind") == name)
                                       .orderBy("k").limit(EXAMPLES).select("k").collect()]
        return diff
    finally:
        classified.unpersist()
