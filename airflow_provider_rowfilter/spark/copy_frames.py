"""Table synchronization on Spark: one task per range of the published rows, each a COPY-to-COPY stream.

Spark schedules and retries the partitions; the rows themselves never enter the JVM. Each task
runs the publisher's ``COPY (SELECT … WHERE filter AND range) TO STDOUT`` in the snapshot the
driver exported and streams its output, as bytes in blocks of whole lines, into ``COPY … FROM
STDIN`` on the subscriber (:func:`copy_partition`).

An earlier version read the rows over JDBC and built the COPY lines with Spark SQL expressions;
decoding every value in the JVM and handing the lines to Python cost more CPU than both
PostgreSQL backends together (docs/initial-sync.md, "Speed").

Only the DataFrame API is used (no SparkContext, no RDD, no accumulator), so the copy runs the same
in a classic session and as a Spark Connect client (spark/session.py): each task reports its rows as
its one output row, and the driver sums them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_rowfilter.publisher.copy_source import DEFAULT_BLOCK_ROWS, ExportedSnapshot, read_copy
from airflow_provider_rowfilter.subscriber.copy_target import CopyFence, write_copy


class RowCount:
    """A task's own count of the rows it wrote (what ``copy_partition`` adds to, as to an accumulator)."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, rows: int) -> None:
        self.value += rows


def run_partitions(spark: SparkSession, reads: Sequence[str],
                   task: Callable[[RowCount, Iterable[str]], None]) -> int:
    """Run ``task(counter, reads)`` on Spark's executors, one partition (one task) per element of ``reads``.

    ``task`` receives its partition's reads (exactly one) and adds the rows it wrote to ``counter``.
    Returns the rows of all tasks. Failed tasks are retried by Spark as any other (a failed attempt's
    count is not returned: only a finished task's output row is); the job fails when a task fails for good.
    """
    if not reads:
        return 0
    reads = list(reads)

    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # on the executor

        for batch in batches:
            for index in batch.column(0).to_pylist():
                counter = RowCount()
                task(counter, [reads[index]])
                yield pa.RecordBatch.from_pydict({"rows": [counter.value]}, schema=pa.schema([("rows", pa.int64())]))

    # spark.range with as many partitions as elements puts exactly one index in each partition.
    written = spark.range(0, len(reads), 1, len(reads)).mapInArrow(body, "rows long")
    return int(written.agg(F.sum("rows")).collect()[0][0] or 0)


def default_parallelism(spark: SparkSession) -> int:
    """The cluster's default parallelism (``SparkContext.defaultParallelism``), also through Spark Connect.

    A ``spark.range`` without a partition count gets ``spark.sql.leafNodeDefaultParallelism``, which
    defaults to the context's default parallelism: its last partition id + 1 is that number.
    """
    rows = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p")).collect()
    return int(rows[0][0]) + 1


def speculation(spark: SparkSession) -> bool:
    """Whether Spark runs speculative copies of slow tasks (``spark.speculation``): a copy task must run once."""
    return str(spark.conf.get("spark.speculation", "false")).strip().lower() == "true"


def copy_partition(source: dict[str, str], snapshot: ExportedSnapshot | None, target: dict[str, str],
                   statement: str, counter, reads: Iterable[str], *, fence: CopyFence | None = None,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> None:
    """``foreachPartition`` body: each ``COPY … TO STDOUT`` of ``reads`` streamed into ``statement``.

    The publisher's COPY output (read in ``snapshot`` with ``source``) goes to the subscriber's
    ``COPY … FROM STDIN`` (``target``) block by block, as bytes: one subscriber transaction per
    read. The rows written are added to ``counter`` (:class:`RowCount`).
    """
    for read in reads:
        with closing(read_copy(source, read, snapshot, block_rows=block_rows)) as blocks:
            counter.add(write_copy(target, statement, blocks, fence))
