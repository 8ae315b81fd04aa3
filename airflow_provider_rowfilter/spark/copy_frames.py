"""The initial copy on Spark: one task per range of the published rows, each a COPY-to-COPY stream.

Spark schedules and retries the partitions; the rows themselves never enter the JVM. Each task
runs the publisher's ``COPY (SELECT … WHERE filter AND range) TO STDOUT`` in the snapshot the
driver exported and streams its output, as bytes in blocks of whole lines, into ``COPY … FROM
STDIN`` on the subscriber (:func:`airflow_provider_rowfilter.subscriber.copy_target.copy_partition`).

An earlier version read the rows over JDBC and built the COPY lines with Spark SQL expressions;
decoding every value in the JVM and handing the lines to Python cost more CPU than both
PostgreSQL backends together (docs/initial-sync.md, "Speed").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pyspark.sql import SparkSession


def run_partitions(spark: SparkSession, reads: Sequence[str], task: Callable[[Iterable[str]], None]) -> None:
    """Run ``task`` on Spark's executors with one partition (one task) per element of ``reads``.

    ``task`` is a ``foreachPartition`` body: it receives the partition's reads (exactly one).
    Failed tasks are retried by Spark as any other; the job fails when a task fails for good.
    """
    if not reads:
        return
    spark.sparkContext.parallelize(list(reads), len(reads)).foreachPartition(task)
