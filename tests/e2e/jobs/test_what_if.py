"""★ What-if before an ALTER PUBLICATION (issue 46): `rowfilter validate --what-if "ALTER PUBLICATION …"` says how
many rows of each table would enter and leave, writing nothing, and the counts are exactly what `reconcile
--dry-run` finds after the real ALTER, on a real publisher and a subscriber the product synchronized."""

from __future__ import annotations

import json

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.jobs.refresh import refresh
from airflow_provider_rowfilter.jobs.snapshot import sync_tables

TABLES = """
CREATE TABLE t (id int PRIMARY KEY, v int, note text);
CREATE TABLE t2 (id int PRIMARY KEY, region text);
CREATE TABLE t3 (id int PRIMARY KEY);
"""
ROWS = """
ALTER TABLE t REPLICA IDENTITY FULL; ALTER TABLE t2 REPLICA IDENTITY FULL;
INSERT INTO t SELECT g, CASE WHEN g % 17 = 0 THEN NULL ELSE g % 50 END, 'n' || g FROM generate_series(1, 400) g;
INSERT INTO t2 SELECT g, (ARRAY['eu', 'us', 'apac'])[1 + g % 3] FROM generate_series(1, 300) g;
INSERT INTO t3 SELECT generate_series(1, 25);
CREATE PUBLICATION p FOR TABLE t WHERE (v > 10), t2 WHERE (region <> 'apac');
CREATE PUBLICATION p2 FOR TABLE t WHERE (v < 3);
"""
#: Widens one filter and narrows another (NULLs among the rows), and adds a table: the ALTER of a team's week three.
ALTER = "ALTER PUBLICATION p SET TABLE t WHERE (v > 30 OR v IS NULL), t2 WHERE (region = 'eu' AND id > 40), t3"


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def publication_tables(pub: str) -> list[tuple]:
    with psycopg.connect(pub) as conn:
        return conn.execute("SELECT pubname, tablename, rowfilter FROM pg_publication_tables ORDER BY 1, 2").fetchall()


@pytest.fixture
def synced(fresh_db, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, TABLES, ROWS)
    execute(sub, TABLES)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"subscription": "whatif", "publisher": pub, "subscriber": sub,
                                    "publications": ["p", "p2"], "change_log": str(tmp_path / "log")}))
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    assert sync_tables(spec).ok
    apply(spec)
    return pub, sub, spec, path


def test_what_if_counts_equal_reconcile_dry_run_after_the_real_alter(synced, capsys):
    pub, sub, spec, path = synced
    catalog = publication_tables(pub)
    assert cli.main(["validate", "--spec", str(path), "--what-if", ALTER, "--format", "json"]) == 0
    found = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}
    assert publication_tables(pub) == catalog  # nothing ran on the publisher
    t, t2, t3 = found["public.t"], found["public.t2"], found["public.t3"]
    assert t["change"] == t2["change"] == "changed" and t3["change"] == "added" and t3["rows"] == 25
    assert t["enter"] > 0 and t["leave"] > 0 and t2["leave"] > 0, found  # both ways, so the equality says something
    # The text form says the same.
    assert cli.main(["validate", "--spec", str(path), "--what-if", ALTER]) == 0
    said = capsys.readouterr().out
    assert f"public.t: {t['enter']:,} rows would enter, {t['leave']:,} would leave" in said
    assert "public.t3: newly subscribed: 25 rows would be copied (state i)" in said

    execute(pub, ALTER)  # the real statement
    assert cli.main(["reconcile", "--spec", str(path), "--dry-run", "--json", "--table", "public.t",
                     "--table", "public.t2"]) == 0
    dry = {r["table"]: r for r in json.loads(capsys.readouterr().out)["tables"]}
    for name in ("public.t", "public.t2"):
        assert (dry[name]["missing"], dry[name]["extra"], dry[name]["different"]) == (
            found[name]["enter"], found[name]["leave"], 0), (name, dry[name], found[name])
    print("what-if:", {n: (found[n]["enter"], found[n]["leave"]) for n in ("public.t", "public.t2")})


def test_what_postgresql_refuses_is_refused_and_nothing_changes(synced, capsys):
    pub, sub, spec, path = synced
    catalog = publication_tables(pub)
    assert cli.main(["validate", "--spec", str(path), "--what-if",
                     "ALTER PUBLICATION p SET TABLE t WHERE (random() > 0.5)"]) == 1
    err = capsys.readouterr().err
    assert "invalid publication WHERE expression" in err, err
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="invalid publication WHERE expression"):
        execute(pub, "ALTER PUBLICATION p SET TABLE t WHERE (random() > 0.5)")  # PostgreSQL, the referee
    assert cli.main(["validate", "--spec", str(path), "--what-if", "ALTER PUBLICATION nope ADD TABLE t3"]) == 1
    assert 'publication "nope" does not exist' in capsys.readouterr().err
    assert publication_tables(pub) == catalog
