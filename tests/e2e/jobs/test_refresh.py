"""RefreshPublication against a real publisher and subscriber."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.core.errors import RowFilterError
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.publisher.capture_objects import CaptureError

SCHEMA = """
CREATE TABLE t1 (a int PRIMARY KEY, b text);
CREATE TABLE t2 (id int PRIMARY KEY, v int);
CREATE TABLE parent (id int, r text, PRIMARY KEY (id, r)) PARTITION BY LIST (r);
CREATE TABLE parent_a PARTITION OF parent FOR VALUES IN ('a');
CREATE TABLE parent_b PARTITION OF parent FOR VALUES IN ('b');
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5), t2;
CREATE PUBLICATION p2 FOR TABLE parent WITH (publish_via_partition_root = true);
"""


@pytest.fixture
def dbs(fresh_db):
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return pub, sub


def spec(pub: str, sub: str, **extra) -> SubscriptionSpec:
    return SubscriptionSpec(subscription="s1", publisher=pub, subscriber=sub, publications=("p1", "p2"), **extra)


def rel_states(sub: str) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(sub) as conn:
        return {f"{s}.{t}": (state, lsn) for s, t, state, lsn in conn.execute(
            "SELECT schema_name, table_name, state, lsn::text FROM rowfilter.subscription_rel")}


def capture(pub: str) -> tuple[list, list]:
    with psycopg.connect(pub) as conn:
        slots = conn.execute("SELECT slot_name, plugin FROM pg_replication_slots WHERE slot_name = 'rowfilter_s1'"
                             ).fetchall()
        tables = conn.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables "
                              "WHERE pubname = 'rowfilter_s1' ORDER BY 1").fetchall()
    return slots, [t for (t,) in tables]


def test_refresh_adds_tables_in_init_and_creates_capture_objects(dbs):
    pub, sub = dbs
    result = refresh(spec(pub, sub, filtering="spark"))
    assert result.added == ["public.parent", "public.t1", "public.t2"] and result.slot_created
    assert rel_states(sub) == {"public.parent": ("i", None), "public.t1": ("i", None), "public.t2": ("i", None)}
    slots, tables = capture(pub)
    assert slots == [("rowfilter_s1", "pgoutput")]
    assert tables == ["public.parent_a", "public.parent_b", "public.t1", "public.t2"]  # leaves, unfiltered


def test_second_refresh_changes_nothing(dbs):
    pub, sub = dbs
    refresh(spec(pub, sub))
    before = rel_states(sub)
    again = refresh(spec(pub, sub))
    assert not again.changed and (again.added, again.removed) == ([], [])
    assert rel_states(sub) == before
    with psycopg.connect(sub) as conn:
        assert conn.execute("SELECT count(*) FROM rowfilter.refresh_history").fetchone()[0] == 1


def test_without_copy_data_tables_start_ready_at_the_current_position(dbs):
    pub, sub = dbs
    result = refresh(spec(pub, sub, copy_data=False))
    assert set(rel_states(sub).values()) == {("r", result.lsn)}


def test_tables_follow_alter_publication(dbs):
    pub, sub = dbs
    refresh(spec(pub, sub, filtering="spark"))
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("ALTER PUBLICATION p1 DROP TABLE t2")
        conn.execute("CREATE TABLE t3 (id int PRIMARY KEY)")
        conn.execute("ALTER PUBLICATION p1 ADD TABLE t3")
    result = refresh(spec(pub, sub, filtering="spark"))
    assert (result.added, result.removed) == (["public.t3"], ["public.t2"])
    assert sorted(rel_states(sub)) == ["public.parent", "public.t1", "public.t3"]
    assert capture(pub)[1] == ["public.parent_a", "public.parent_b", "public.t1", "public.t3"]


def test_invalid_definitions_change_nothing(dbs, tmp_path):
    pub, sub = dbs
    (tmp_path / "pubs.sql").write_text("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (now() > '2020-01-01');\n"
                                       "CREATE PUBLICATION p2 FOR TABLE t2;")
    with pytest.raises(RowFilterError, match="invalid publication WHERE expression"):
        refresh(spec(pub, sub, publications_ddl=str(tmp_path / "pubs.sql")))
    assert capture(pub) == ([], [])
    with psycopg.connect(sub) as conn:
        assert conn.execute("SELECT to_regclass('rowfilter.subscription_rel')").fetchone()[0] is None


def test_a_publication_we_did_not_create_is_never_altered(dbs):
    pub, sub = dbs
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION rowfilter_s1 FOR TABLE t1")
    with pytest.raises(CaptureError, match='publication "rowfilter_s1" exists on the publisher and is not ours'):
        refresh(spec(pub, sub, filtering="spark"))
    slots, tables = capture(pub)
    assert (slots, tables) == ([], ["public.t1"])


def test_status_json_follows_the_contract(dbs, tmp_path: Path):
    pub, sub = dbs
    refresh(spec(pub, sub))
    path = tmp_path / "s1.yaml"
    path.write_text(yaml.safe_dump({"subscription": "s1", "publisher": pub, "subscriber": sub,
                                    "publications": ["p1", "p2"]}))
    exe = str(Path(sys.executable).parent / "rowfilter")
    out = subprocess.run([exe, "status", "--json", "--spec", str(path)], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["subscription"] == "s1"
    assert [(t["table"], t["state"], t["lsn"]) for t in doc["tables"]] == [
        ("public.parent", "i", None), ("public.t1", "i", None), ("public.t2", "i", None)]
    human = subprocess.run([exe, "status", "--spec", str(path)], capture_output=True, text=True, check=True)
    assert "public.t1" in human.stdout and "init" in human.stdout


def test_status_before_any_refresh_says_to_run_refresh(dbs, tmp_path: Path, capsys):
    pub, sub = dbs  # the subscriber has no rowfilter schema yet
    path = tmp_path / "s1.yaml"
    path.write_text(yaml.safe_dump({"subscription": "s1", "publisher": pub, "subscriber": sub,
                                    "publications": ["p1"]}))
    from airflow_provider_rowfilter.cli import main

    assert main(["status", "--spec", str(path)]) == 1
    err = capsys.readouterr().err
    assert "subscription 's1' has no state in the subscriber" in err and "rowfilter refresh" in err
    assert "Traceback" not in err


def test_source_filtering_keeps_no_capture_publication_and_drops_ours_left_from_spark(dbs):
    pub, sub = dbs
    refresh(spec(pub, sub, filtering="spark"))
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION rowfilter_s1_insert_x FOR TABLE t1")  # not ours: a name we never use
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname LIKE 'rowfilter_s1%'").fetchone()[0] == 6
    result = refresh(spec(pub, sub))  # auto: source on this PostgreSQL 18, the definitions in its catalog
    assert result.filtering == "source" and result.capture_publication_changed and not result.slot_created
    with psycopg.connect(pub, autocommit=True) as conn:
        assert [n for (n,) in conn.execute("SELECT pubname FROM pg_publication WHERE pubname LIKE 'rowfilter_s1%'")] \
            == ["rowfilter_s1_insert_x"]
    assert capture(pub) == ([("rowfilter_s1", "pgoutput")], [])
    assert not refresh(spec(pub, sub)).changed  # nothing more to drop, nothing created
