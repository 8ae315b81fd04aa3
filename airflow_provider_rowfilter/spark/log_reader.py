"""Spark reads the change log's segments: local paths, or the same objects by their Hadoop URLs on a cluster.

A log on object storage (change_log/store.py) is read by the executors themselves through Hadoop's
connector for the store: ``s3://`` becomes ``s3a://`` (hadoop-aws), ``abfs://`` becomes ``abfss://``
(hadoop-azure), ``gs://`` (the GCS connector) and ``hdfs://`` stay as they are. A Spark that has no
connector for the scheme (a ``local[*]`` session without the hadoop-aws jars, as in the tests here)
reads the batch's segments on the driver with pyarrow, with the same credentials the capture used, and
hands them to Spark as Arrow: the same rows, through the driver's memory (a WARNING says which
connector would let the executors read them; docs/change-log.md, "On object storage").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_rowfilter.core.spec.log_location import is_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The Hadoop scheme of each object store's URL, and the connector a cluster needs for it.
HADOOP_SCHEMES = {"s3": ("s3a", "org.apache.hadoop:hadoop-aws (with the AWS SDK bundle it names)"),
                  "abfs": ("abfss", "org.apache.hadoop:hadoop-azure"),
                  "gs": ("gs", "com.google.cloud.bigdataoss:gcs-connector"),
                  "hdfs": ("hdfs", "Hadoop's HDFS client (in Spark's Hadoop jars)")}


def hadoop_url(path: str) -> str:
    """The URL Spark's executors read ``path`` by (a local path as it is)."""
    if not is_url(path):
        return path
    scheme, rest = path.split(":", 1)
    return HADOOP_SCHEMES.get(scheme.lower(), (scheme, ""))[0] + ":" + rest


def segments_frame(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The segments as one DataFrame of the change log's rows."""
    urls = [hadoop_url(p) for p in paths]
    remote = next((u for u in urls if is_url(u)), None)
    if remote is None or _hadoop_reads(spark, remote.split(":", 1)[0]):
        return spark.read.parquet(*urls)
    scheme = paths[0].split(":", 1)[0].lower()
    log.warning("Spark has no Hadoop connector for %s:// (%s): the driver reads the batch's %d segment(s) from the "
                "store and hands them to Spark", HADOOP_SCHEMES[scheme][0], HADOOP_SCHEMES[scheme][1], len(paths))
    return spark.createDataFrame(pa.concat_tables(pq.read_table(p) for p in paths))


def _hadoop_reads(spark: SparkSession, scheme: str) -> bool:
    """Whether the session's Hadoop has a file system for ``scheme`` (True when it cannot be asked: Spark Connect)."""
    try:
        jvm, jsc = spark._jvm, spark._jsc
        if jvm is None or jsc is None:
            return True  # no JVM here: Spark Connect, whose server decides
        conf = jsc.hadoopConfiguration()
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
        return True
    except Exception as e:  # py4j's "No FileSystem for scheme", or no JVM (Connect)
        return "No FileSystem for scheme" not in str(e) and "ClassNotFound" not in str(e)
