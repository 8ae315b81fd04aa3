"""One table of every supported column type, evaluated by PostgreSQL and by our Spark translation.

Shared by the differential property test and the table-driven translation regressions. The Spark
side sees the rows exactly as the product will: PostgreSQL's text output of each value, cast in
Spark to the column's Spark type (``CAST(text AS <spark type>)``). :func:`apply_filter_text` and
:func:`apply_frame` go further: the filter as the apply evaluates it, recorded by a refresh and
loaded by the apply, reading each value from the change's array of text values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from sqlglot import exp

from airflow_provider_rowfilter.core.apply.plan import ApplyPlan, EpochRules, TargetPlan
from airflow_provider_rowfilter.core.filters import pg_types as T
from airflow_provider_rowfilter.core.filters.row_filter import RowFilter
from airflow_provider_rowfilter.core.filters.spark_translation import to_spark_text, typed_read
from airflow_provider_rowfilter.core.publication.model import PublishAction
from airflow_provider_rowfilter.core.publication.subscription_filters import (
    SubscriptionFilters,
    TableFilters,
    filters_document,
)
from airflow_provider_rowfilter.core.relation import Column, Relation, RelKind, TableName

TABLE = "filter_rows"

# (name, format_type() text, type OID); id is the key every result is ordered by.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("id", "integer", 23),
    ("i2", "smallint", 21),
    ("i4", "integer", 23),
    ("i8", "bigint", 20),
    ("n", "numeric(12,3)", 1700),
    ("f8", "double precision", 701),
    ("f4", "real", 700),
    ("b", "boolean", 16),
    ("t", "text", 25),
    ("v", "character varying(10)", 1043),
    ("c", "character(4)", 1042),
    ("d", "date", 1082),
    ("ts", "timestamp without time zone", 1114),
    ("tz", "timestamp with time zone", 1184),
    ("u", "uuid", 2950),
    ("ia", "integer[]", 1007),  # op ANY/ALL over an array column (read from PostgreSQL's text form)
    ("ta", "text[]", 1009),
    ("na", "numeric(6,2)[]", 1231),  # its elements NaN too (numeric's special values, core/filters/spark_numeric.py)
)
DATA_COLUMNS = tuple(name for name, _, _ in COLUMNS if name != "id")
_TEXT_OIDS = {25, 1043, 1042, 1009}

RELATION = Relation(
    name=TableName("public", TABLE),
    oid=16384,
    relkind=RelKind.TABLE,
    columns=tuple(
        Column(name, attnum, type_name, oid, collation="default" if oid in _TEXT_OIDS else None)
        for attnum, (name, type_name, oid) in enumerate(COLUMNS, start=1)
    ),
    identity_columns=("id",),
)

CREATE_TABLE = sql.SQL("CREATE TABLE {} ({})").format(
    sql.Identifier(TABLE),
    sql.SQL(", ").join(
        sql.SQL("{} {}{}").format(
            sql.Identifier(name), sql.SQL(type_name), sql.SQL(" PRIMARY KEY" if name == "id" else "")
        )
        for name, type_name, _ in COLUMNS
    ),
)

Row = dict[str, object]  # column -> Python value psycopg adapts (None for NULL)
TextRow = tuple[str | None, ...]  # PostgreSQL's text output, in COLUMNS order


def spark_type_of(type_name: str) -> str:
    spark = T.spark_type(T.parse_type(type_name))
    assert spark is not None, type_name
    return spark


@dataclass(frozen=True)
class Outcome:
    """What one side made of a filter over the rows: per-row True/False/None, or an error."""

    values: tuple[bool | None, ...] | None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def create_table(conn: psycopg.Connection) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
    conn.execute(CREATE_TABLE)


def replace_rows(conn: psycopg.Connection, rows: Sequence[Row]) -> list[TextRow]:
    """Make the table hold exactly ``rows`` (ids 1..n) and return them as PostgreSQL prints them."""
    conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    names = [name for name, _, _ in COLUMNS]
    insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(TABLE),
        sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.Placeholder() * len(names)),
    )
    with conn.cursor() as cur:
        cur.executemany(insert, [[i, *(row.get(n) for n in names[1:])] for i, row in enumerate(rows, start=1)])
    return read_text_rows(conn)


def insert_text_rows(conn: psycopg.Connection, rows: Sequence[dict[str, str | None]]) -> list[TextRow]:
    """Like :func:`replace_rows`, for rows given as PostgreSQL input text (``'t'``, ``'1.5'`` …)."""
    conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    for i, row in enumerate(rows, start=1):
        names = ["id", *row]
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(TABLE),
                sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(", ").join(
                    sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(dict((n, t) for n, t, _ in COLUMNS)[k]))
                    for k, v in [("id", str(i)), *row.items()]
                ),
            )
        )
    return read_text_rows(conn)


class _OutputText(Loader):
    """Keep each value as its type's output function prints it (``character(4)`` keeps its padding,
    unlike ``::text``)."""

    def load(self, data: Buffer) -> str:
        return bytes(data).decode()


def read_text_rows(conn: psycopg.Connection) -> list[TextRow]:
    query = sql.SQL("SELECT {} FROM {} ORDER BY id").format(
        sql.SQL(", ").join(sql.Identifier(n) for n, _, _ in COLUMNS), sql.Identifier(TABLE)
    )
    with conn.cursor(binary=False) as cur:
        for _, _, oid in COLUMNS:
            cur.adapters.register_loader(oid, _OutputText)
        return [tuple(r) for r in cur.execute(query).fetchall()]


def pg_evaluate(conn: psycopg.Connection, filter_sql: str) -> Outcome:
    """``SELECT id, (<filter>) FROM t ORDER BY id`` in PostgreSQL (in a transaction rolled back)."""
    try:
        with conn.transaction(force_rollback=True):
            rows = conn.execute(f"SELECT id, ({filter_sql}) FROM {TABLE} ORDER BY id").fetchall()
    except psycopg.Error as e:
        return Outcome(None, f"{e.sqlstate}: {str(e).splitlines()[0]}")
    return Outcome(tuple(r[1] for r in rows))


def pg_accepts_filter(conn: psycopg.Connection, filter_sql: str) -> str | None:
    """Ask PostgreSQL itself whether the filter is a valid publication row filter; None = accepted."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f"CREATE PUBLICATION rowfilter_referee FOR TABLE {TABLE} WHERE ({filter_sql})")
    except psycopg.Error as e:
        return f"{e.sqlstate}: {str(e).splitlines()[0]}"
    return None


def spark_frame(spark, text_rows: Sequence[TextRow]):
    """The rows as a Spark DataFrame: PostgreSQL's text form cast to each column's Spark type."""
    schema = ", ".join(f"`{name}` STRING" for name, _, _ in COLUMNS)
    frame = spark.createDataFrame(list(text_rows), schema)
    return frame.selectExpr(
        *(f"{to_spark_text(typed_read(exp.column(name, quoted=True), T.parse_type(type_name)))} AS `{name}`"
          for name, type_name, _ in COLUMNS)
    )


def recorded_rules(row_filter: RowFilter) -> EpochRules:
    """The definitions a refresh records for a table filtered by ``row_filter`` (its ``insert`` filter),
    stored as JSON and loaded back as the apply loads them."""
    name = TableName("public", TABLE)
    table = TableFilters(table=name, leaves=(name,), actions=frozenset({PublishAction.INSERT}),
                         filters={PublishAction.INSERT: (row_filter,)}, copy_filters=None, columns=None,
                         publications=("p",))
    document = filters_document(SubscriptionFilters(("p",), {name: table}), "s", with_trees=True)
    return EpochRules.from_document(json.loads(json.dumps(document))["tables"][0])


def apply_filter_text(rules: EpochRules) -> str:
    """The Spark SQL the apply evaluates for the ``insert`` filter of ``rules`` over a change's new values
    (``_nv``: the PostgreSQL text form of every column, in :data:`COLUMNS` order)."""
    from airflow_provider_rowfilter.spark.judge import BatchColumns, evaluated_filter
    from airflow_provider_rowfilter.spark.sql_trees import text as sql_text

    name = TableName("public", TABLE)
    target = TargetPlan(0, name, (name,), 0, tuple(n for n, _, _ in COLUMNS), ("id",), (rules,))
    names = BatchColumns(ApplyPlan((0,), (target,)))
    assert names.names == target.columns, "the values must be laid out as the apply lays them out"
    expression = evaluated_filter(rules, "insert", names, "_nv")
    assert expression is not None
    return sql_text(expression)


def apply_frame(spark, text_rows: Sequence[TextRow]):
    """The rows as the apply reads a change: ``id`` (to order the results) and ``_nv``, the text values."""
    schema = ", ".join(f"`{name}` STRING" for name, _, _ in COLUMNS)
    values = ", ".join(f"`{name}`" for name, _, _ in COLUMNS)
    return spark.createDataFrame(list(text_rows), schema).selectExpr("CAST(`id` AS INT) AS `id`",
                                                                     f"array({values}) AS `_nv`")


def spark_evaluate(frame, spark_sqls: Sequence[str]) -> list[Outcome]:
    """Evaluate each Spark boolean expression over ``frame``; one Spark job when none fails.

    Analysis and parse errors (a translation Spark cannot even compile) are raised, never counted
    as a run-time error that could pair with one of PostgreSQL's.
    """
    from pyspark.errors import AnalysisException, ParseException

    if not spark_sqls:
        return []
    try:
        return _collect(frame, spark_sqls)
    except (AnalysisException, ParseException):
        if len(spark_sqls) == 1:
            raise
    except Exception as e:  # a run-time error of Spark's: split to see whose
        if len(spark_sqls) == 1:
            return [Outcome(None, f"{type(e).__name__}: {_first_line(e)}")]
    return [spark_evaluate(frame, [s])[0] for s in spark_sqls]


def _collect(frame, spark_sqls: Sequence[str]) -> list[Outcome]:
    exprs = ["`id`", *(f"({s}) AS `r{i}`" for i, s in enumerate(spark_sqls))]
    rows = sorted(frame.selectExpr(*exprs).collect(), key=lambda r: r[0])
    return [Outcome(tuple(r[i + 1] for r in rows)) for i in range(len(spark_sqls))]


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else repr(e)
