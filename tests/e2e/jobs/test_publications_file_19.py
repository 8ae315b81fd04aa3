"""PostgreSQL 19's publications in a publications file, end to end on a PostgreSQL 18 publisher (no 19 server can be
had here; the file, not the publisher, defines the publications, core/publication/ddl.py).

``FOR ALL TABLES EXCEPT (TABLE …)``: the excluded table is neither subscribed nor copied, its changes are not applied,
and when it leaves the exception list (``ALTER PUBLICATION … SET ALL TABLES``) the next refresh subscribes it, as
``REFRESH PUBLICATION`` does, and it is copied and streamed. ``FOR ALL SEQUENCES``: ``sync-sequences`` moves every
sequence of the publisher's database the publication publishes, matched by name as PostgreSQL 19 matches them, where
without it only the subscribed tables' own sequences are moved (as before 19). The referee is the publisher's rows:
a native subscription of 18 cannot read such a file.
"""

from __future__ import annotations

import dataclasses

import psycopg

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.sync_sequences import NO_NAMESAKE, sync_sequences
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.databases import names

TABLES = """
CREATE TABLE t1 (id serial PRIMARY KEY, v text);
CREATE TABLE t2 (id int PRIMARY KEY, v text);
CREATE TABLE t3 (id int PRIMARY KEY, v text);
CREATE SEQUENCE free_seq;
"""
PUBLISHER = TABLES + """
INSERT INTO t1 (v) SELECT 'one ' || g FROM generate_series(1, 30) g;
INSERT INTO t2 SELECT g, 'two ' || g FROM generate_series(1, 20) g;
INSERT INTO t3 SELECT g, 'three ' || g FROM generate_series(1, 10) g;
SELECT setval('free_seq', 700);
CREATE SEQUENCE only_on_the_publisher;
"""
EXCEPT_T2 = "CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE t2);\n"
CHANGES = ("INSERT INTO t1 (v) VALUES ('new'); INSERT INTO t2 VALUES (100, 'new'); UPDATE t3 SET v = 'changed' "
           "WHERE id = 3; DELETE FROM t2 WHERE id = 1")


def execute(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def states(spec: SubscriptionSpec) -> dict[str, str]:
    with psycopg.connect(spec.subscriber) as conn:
        return dict(conn.execute("SELECT table_name, state FROM rowfilter.subscription_rel WHERE subscription = %s",
                                 (spec.subscription,)).fetchall())


def test_an_excluded_table_is_neither_subscribed_nor_copied_and_joins_when_it_leaves_the_list(fresh_db, spark,
                                                                                              tmp_path):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, PUBLISHER)
    execute(sub, TABLES)
    ddl = tmp_path / "publications.sql"
    ddl.write_text(EXCEPT_T2)
    spec = SubscriptionSpec(subscription=f"except_{next(names)}", publisher=pub, subscriber=sub, publications=("p",),
                            publications_ddl=str(ddl), change_log=str(tmp_path / "log"))
    refresh(spec)
    assert sync_tables(spec, spark=spark).ok
    assert states(spec) == {"t1": "f", "t3": "f"}  # t2 is not subscribed
    execute(pub, CHANGES)
    apply(spec, spark=spark)
    for table in ("t1", "t3"):
        assert table_rows(sub, table) == table_rows(pub, table), table
    assert table_rows(sub, "t2") == []  # neither copied nor streamed
    # t2 leaves the exception list: the next refresh subscribes it (REFRESH PUBLICATION), the copy brings it.
    ddl.write_text(EXCEPT_T2 + "ALTER PUBLICATION p SET ALL TABLES;\n")
    result = refresh(spec)
    assert [str(t) for t in result.added] == ["public.t2"], result
    assert states(spec) == {"t1": "r", "t2": "i", "t3": "r"}
    assert sync_tables(spec, spark=spark).ok
    assert states(spec) == {"t1": "r", "t2": "f", "t3": "r"}
    for table in ("t1", "t2", "t3"):
        assert table_rows(sub, table) == table_rows(pub, table), table
    # and excluded again: the refresh removes it, as REFRESH PUBLICATION does (its rows stay, as natively)
    ddl.write_text(EXCEPT_T2 + "ALTER PUBLICATION p SET ALL TABLES EXCEPT (TABLE t2, t3);\n")
    assert sorted(str(t) for t in refresh(spec).removed) == ["public.t2", "public.t3"]
    assert set(states(spec)) == {"t1"}


def test_for_all_sequences_gives_sync_sequences_every_published_sequence(fresh_db, tmp_path, capsys):
    pub, sub = fresh_db(), fresh_db()
    execute(pub, PUBLISHER)
    execute(sub, TABLES)
    ddl = tmp_path / "publications.sql"
    ddl.write_text("CREATE PUBLICATION p FOR TABLE t1, t3;\nCREATE PUBLICATION seqs FOR ALL SEQUENCES;\n")
    spec = SubscriptionSpec(subscription=f"allseq_{next(names)}", publisher=pub, subscriber=sub, publications=("p",),
                            publications_ddl=str(ddl), change_log=str(tmp_path / "log"))
    refresh(spec)
    before = sync_sequences(spec, dry_run=True)  # p publishes no sequence: t1's own, as before PostgreSQL 19
    assert before.published is None
    assert [(s.publisher_sequence, s.action) for s in before.sequences] == [("public.t1_id_seq", "would set")]
    spec = dataclasses.replace(spec, publications=("p", "seqs"))
    result = sync_sequences(spec)
    assert result.ok and result.published == ["public.free_seq", "public.only_on_the_publisher", "public.t1_id_seq"]
    assert {s.publisher_sequence: (s.action, s.after) for s in result.sequences} == {
        "public.free_seq": ("set", 701), "public.only_on_the_publisher": (NO_NAMESAKE, None),
        "public.t1_id_seq": ("set", 31)}
    with psycopg.connect(sub, autocommit=True) as conn:
        assert conn.execute("SELECT nextval('free_seq'), nextval('t1_id_seq')").fetchone() == (701, 31)
    assert all(s.action in ("already past", NO_NAMESAKE) for s in sync_sequences(spec).sequences)  # once
    path = tmp_path / "spec.yaml"
    path.write_text(f"subscription: {spec.subscription}\npublisher: '{pub}'\nsubscriber: '{sub}'\n"
                    f"publications: [p, seqs]\npublications_ddl: '{ddl}'\nchange_log: '{tmp_path / 'log'}'\n")
    capsys.readouterr()
    assert cli.main(["sync-sequences", "--spec", str(path), "--dry-run"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "its publications are FOR ALL SEQUENCES: 3 sequences published" in said, said
    assert f"public.only_on_the_publisher: - {NO_NAMESAKE}" in said, said
