"""Spark reads the change log's segments: local paths, or the store's objects read by the executors themselves.

A log in a directory (on a local master, or a disk every executor mounts) is read by Spark's own Parquet
reader. A log on object storage (change_log/store.py) is read by the executors, never through the driver:

- through Hadoop's connector for the store when the cluster has one (``s3://`` as ``s3a://``, hadoop-aws;
  ``abfs://`` as ``abfss://``, hadoop-azure; ``gs://``, the GCS connector): Spark's JVM reader, no Python
  worker. ``hdfs://`` always (Spark's Hadoop jars have its client);
- else with pyarrow's filesystem for the store inside the executors' Python workers (``mapInArrow`` over a
  small frame of the batch's segment parts, :func:`~..change_log.segment_reader.read_parts`): no connector,
  no Maven repository, the same pyarrow the jobs import. The store's credentials reach the tasks in the task
  itself (change_log/store.py ``StoreAccess``), never a command line, a Spark setting or a log.

Whether the cluster has the connector: a classic session asks its JVM for the scheme's FileSystem class; a
Spark Connect client asks the server to read the first segment's schema, and takes pyarrow's way when the
server cannot (``ClassNotFoundException: …S3AFileSystem`` is what a server without hadoop-aws answers).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from airflow_provider_rowfilter.change_log.segment_reader import read_parts, segment_parts
from airflow_provider_rowfilter.change_log.segment_schema import SCHEMA
from airflow_provider_rowfilter.change_log.store import StoreAccess
from airflow_provider_rowfilter.core.spec.log_location import is_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: The Hadoop scheme of each object store's URL, and the connector a cluster needs for it.
HADOOP_SCHEMES = {"s3": ("s3a", "org.apache.hadoop:hadoop-aws (with the AWS SDK bundle it names)"),
                  "abfs": ("abfss", "org.apache.hadoop:hadoop-azure"),
                  "gs": ("gs", "com.google.cloud.bigdataoss:gcs-connector"),
                  "hdfs": ("hdfs", "Hadoop's HDFS client (in Spark's Hadoop jars)")}
#: Rows of a segment one executor task reads (the segments' row groups are 10,000 changes:
#: change_log/segment_writer.py): a large batch's read spreads over the cluster's cores.
ROWS_PER_TASK = 50_000


def hadoop_url(path: str) -> str:
    """The URL Spark's executors read ``path`` by through Hadoop (a local path as it is)."""
    if not is_url(path):
        return path
    scheme, rest = path.split(":", 1)
    return HADOOP_SCHEMES.get(scheme.lower(), (scheme, ""))[0] + ":" + rest


def segments_frame(spark: SparkSession, paths: list[str], changes: Sequence[int] | None = None) -> DataFrame:
    """The segments as one DataFrame of the change log's rows, read by the executors.

    :param changes: the log's count of changes of each segment (how many tasks read it), when known.
    """
    remote = next((p for p in paths if is_url(p)), None)
    if remote is None:
        return spark.read.parquet(*paths)
    scheme = remote.split(":", 1)[0].lower()
    urls = [hadoop_url(p) for p in paths]
    if scheme == "hdfs" or _hadoop_reads(spark, HADOOP_SCHEMES[scheme][0], urls[0]):
        return spark.read.parquet(*urls)
    log.info("Spark has no Hadoop connector for %s:// (%s): the executors read the batch's %d segment(s) with "
             "pyarrow", HADOOP_SCHEMES[scheme][0], HADOOP_SCHEMES[scheme][1], len(paths))
    return read_with_pyarrow(spark, paths, changes)


def read_with_pyarrow(spark: SparkSession, paths: Sequence[str], changes: Sequence[int] | None = None) -> DataFrame:
    """The segments on object storage read by the executors' Python workers with pyarrow, a task per part."""
    parts = segment_parts(paths, changes, ROWS_PER_TASK)
    body = partial(read_parts, StoreAccess.of(paths[0]), parts)
    # spark.range with as many partitions as elements puts exactly one part in each task.
    return spark.range(0, len(parts), 1, len(parts)).mapInArrow(body, log_schema())


def log_schema() -> StructType:
    """The change log's rows as Spark reads them from Parquet: :data:`SCHEMA`, every field nullable."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(SCHEMA.with_metadata(None), prefer_timestamp_ntz=False)


def _hadoop_reads(spark: SparkSession, scheme: str, url: str) -> bool:
    """Whether the session's Hadoop has a file system for ``scheme``: a classic session's JVM is asked for its
    class; a Spark Connect server is asked for the schema of ``url`` (whatever it answers instead means no)."""
    jvm = getattr(spark, "_jvm", None)
    jsc = getattr(spark, "_jsc", None)
    if jvm is None or jsc is None:  # Spark Connect: the server decides
        try:
            return len(spark.read.parquet(url).schema.fields) > 0
        except Exception as e:  # the server's error, as Connect raises it: ClassNotFoundException, no FileSystem, …
            log.info("the Spark Connect server does not read %s itself (%s): its executors read it with pyarrow",
                     url, str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__)
            return False
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, jsc.hadoopConfiguration())
        return True
    except Exception as e:  # py4j's "No FileSystem for scheme" or ClassNotFoundException
        return "No FileSystem for scheme" not in str(e) and "ClassNotFound" not in str(e)
