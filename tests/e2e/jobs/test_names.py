"""Publication and table names written in the spec and on the command line find what PostgreSQL's SQL finds."""

from __future__ import annotations

import psycopg
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.core.sync_state import SyncState
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.subscriber.state import StateStore
from tests.e2e.jobs.databases import names
from tests.e2e.jobs.snapshot_scenario import execute

TABLES = 'CREATE TABLE Plain (id int PRIMARY KEY); CREATE TABLE "MixedCase" (id int PRIMARY KEY);'
PUBLISHER = TABLES + 'CREATE PUBLICATION pA FOR TABLE Plain; CREATE PUBLICATION "QuotedPub" FOR TABLE "MixedCase";'


def test_spec_and_command_line_names_are_read_as_sql_reads_them(fresh_db, tmp_path, capsys):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, PUBLISHER)
    execute(sub, TABLES + 'INSERT INTO plain VALUES (1); INSERT INTO "MixedCase" VALUES (2);')
    with psycopg.connect(pub) as conn:  # what PostgreSQL made of the names
        assert sorted(r[0] for r in conn.execute("SELECT pubname FROM pg_publication")) == ["QuotedPub", "pa"]
    name = f"names_{next(names)}"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"subscription": name, "publisher": pub, "subscriber": sub,
                                    "publications": ["pA", '"QuotedPub"']}))
    spec = SubscriptionSpec.load(path)

    result = refresh(spec)  # CREATE SUBSCRIPTION … PUBLICATION pA, "QuotedPub" finds both
    assert sorted(result.added) == ["public.MixedCase", "public.plain"]
    with psycopg.connect(sub, autocommit=True) as conn:
        assert conn.execute("SELECT publications FROM rowfilter.subscription WHERE name = %s",
                            (name,)).fetchone()[0] == ["pa", "QuotedPub"]

    # --table PLAIN is public.plain, '"MixedCase"' is public.MixedCase (resync empties them, back to i).
    assert cli.main(["resync", "--spec", str(path), "--table", "PLAIN", "--table", '"MixedCase"']) == 0, \
        capsys.readouterr().err
    with psycopg.connect(sub, autocommit=True) as conn:
        rels = StateStore(conn, name).tables([TableName("public", "plain"), TableName("public", "MixedCase")])
        assert [r.state for r in rels] == [SyncState.INIT, SyncState.INIT]
        assert conn.execute('SELECT (SELECT count(*) FROM plain) + (SELECT count(*) FROM "MixedCase")').fetchone()[0] == 0
    assert cli.main(["resync", "--spec", str(path), "--table", "MixedCase"]) == 1  # folds to mixedcase: not ours
    assert "table public.mixedcase is not part of subscription" in capsys.readouterr().err
