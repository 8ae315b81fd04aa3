"""The initial copy as Spark frames: published rows read over JDBC, turned into COPY text lines.

Reading: one JDBC read per table with the filter inside the query (never fetch-then-filter), split
into parallel partitions by integer key ranges (Spark's ``partitionColumn``) or by block ranges
(one derived table per range, unioned), every reader in the publisher snapshot the driver exported.

Writing: each row becomes one line of PostgreSQL's COPY text format in the JVM (escaping done by
Spark SQL expressions), and the lines reach Python as UTF-8 strings, without pickling a Row per row,
for ``COPY … FROM STDIN`` on the subscriber.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce

from pyspark.core.rdd import RDD
from pyspark.serializers import UTF8Deserializer
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_rowfilter.pg.copy_source import (
    BlockRanges,
    CopySource,
    ExportedSnapshot,
    KeyRanges,
    ReadPlan,
    subquery_sql,
)
from airflow_provider_rowfilter.spark.jdbc import JdbcConnection

DEFAULT_FETCH_SIZE = 10_000
LINE = "line"

# COPY text format (PostgreSQL docs, COPY "Text Format"): backslash first, then the characters that
# would otherwise end a field or a line.
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))
NULL_MARKER = "\\N"


def published_rows(spark: SparkSession, jdbc: JdbcConnection, source: CopySource, plan: ReadPlan, *,
                   snapshot: ExportedSnapshot | None = None, fetch_size: int = DEFAULT_FETCH_SIZE) -> DataFrame:
    """The published rows of one table, every column a string (its PostgreSQL text form), one partition per range."""

    def reader(dbtable: str):
        r = (spark.read.format("jdbc").option("url", jdbc.url).option("dbtable", dbtable)
             # fetchsize > 0 also makes Spark's PostgreSQL dialect turn autocommit off, so the rows
             # stream through a cursor and the session init below runs inside the read's transaction.
             .option("fetchsize", str(fetch_size)))
        for key, value in jdbc.properties.items():
            r = r.option(key, value)
        if snapshot is not None:
            r = r.option("sessionInitStatement", snapshot.session_init_sql())
        return r

    columns = [column(c) for c in source.columns]
    if isinstance(plan, KeyRanges):
        frame = (reader(subquery_sql(source, with_key=True))
                 .option("partitionColumn", source.key_alias).option("lowerBound", str(plan.lower))
                 .option("upperBound", str(plan.upper)).option("numPartitions", str(plan.partitions)).load())
        return frame.select(*columns)
    if isinstance(plan, BlockRanges):
        frames = [reader(subquery_sql(source, predicate=p)).load() for p in plan.predicates()]
        return reduce(DataFrame.union, frames).select(*columns)
    return reader(subquery_sql(source)).load().select(*columns)


def column(name: str) -> Column:
    """A column by its exact name (dots and backticks in PostgreSQL names are not Spark syntax)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _escaped(name: str) -> Column:
    value = column(name)
    for raw, escaped in _ESCAPES:
        value = F.replace(value, F.lit(raw), F.lit(escaped))
    return value


def copy_text(frame: DataFrame, plain_columns: Iterable[str] = ()) -> DataFrame:
    """One column ``line``: each row as a COPY text-format line (tab-separated, ``\\N`` for NULL).

    Columns in ``plain_columns`` are known never to hold a character COPY escapes and are passed as is.
    """
    plain = set(plain_columns)
    fields = [F.coalesce(column(c) if c in plain else _escaped(c), F.lit(NULL_MARKER)) for c in frame.columns]
    return frame.select(F.concat_ws("\t", *fields).alias(LINE))


def copy_lines(lines: DataFrame) -> RDD:
    """The ``line`` column as an RDD of UTF-8 ``bytes``, one per row, in the frame's partitions.

    ``DataFrame.rdd`` would pickle a Row object per row across the JVM/Python boundary, several
    times slower than the copy itself; a Dataset of strings crosses as plain UTF-8, the way
    ``DataFrame.toJSON`` hands its strings to Python.
    """
    strings = getattr(lines.select(LINE)._jdf, "as")(lines.sparkSession._jvm.org.apache.spark.sql.Encoders.STRING())
    return RDD(strings.javaRDD(), lines.sparkSession.sparkContext, UTF8Deserializer(use_unicode=False))
