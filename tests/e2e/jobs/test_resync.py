"""``rowfilter resync --copy``: every precondition is checked before the table changes (issue 14, item 6).

Each case copies t1 (state f, 950 rows, a stray local row added), breaks one thing the copy needs,
runs ``resync --copy`` and checks that it fails with the cause, leaving the subscriber's table and the
subscription's whole ``subscription_rel`` (state, LSN, rows copied, error, timestamp) as they were.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.flows.table_sync.sync import sync_tables
from airflow_provider_rowfilter.jobs.exit_status import EXIT_TRANSIENT
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.snapshot_scenario import T1, T2, execute


def rel_rows(spec) -> list[tuple]:
    with psycopg.connect(spec.subscriber, autocommit=True) as conn:
        return conn.execute("SELECT * FROM rowfilter.subscription_rel WHERE subscription = %s ORDER BY 2, 3",
                            (spec.subscription,)).fetchall()


def copied(spec, spark, path: str, **extra) -> tuple[str, list[tuple], list[str]]:
    """t1 and t2 copied, a stray row in t1; the spec file rewritten with ``extra``; what must not change."""
    execute(spec.subscriber, T1 + T2)
    refresh(spec)
    assert sync_tables(spec, spark=spark).ok
    execute(spec.subscriber, "INSERT INTO t1 VALUES (1, 'stray', 0)")
    doc = yaml.safe_load(Path(path).read_text())
    Path(path).write_text(yaml.safe_dump({**doc, **extra}))
    return path, rel_rows(spec), table_rows(spec.subscriber, "t1")


def unchanged(spec, rels: list[tuple], rows: list[str]) -> None:
    assert table_rows(spec.subscriber, "t1") == rows
    assert rel_rows(spec) == rels


def test_an_unreachable_publisher_changes_nothing(setup, spark, capsys):  # noqa: F811
    spec, path = setup
    path, rels, rows = copied(spec, spark, path, publisher="postgresql://nobody@127.0.0.1:1/none")
    assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 1
    assert "cannot connect to the publisher" in capsys.readouterr().err
    unchanged(spec, rels, rows)


def test_an_invalid_filter_changes_nothing(setup, spark, capsys, tmp_path):  # noqa: F811
    spec, path = setup
    (tmp_path / "pubs.sql").write_text("CREATE PUBLICATION p1 FOR TABLE t1 WHERE (random() > 0.5);")
    path, rels, rows = copied(spec, spark, path, publications_ddl=str(tmp_path / "pubs.sql"))
    assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 1
    assert "invalid publication WHERE expression" in capsys.readouterr().err
    unchanged(spec, rels, rows)


def test_a_table_no_longer_published_changes_nothing(setup, spark, capsys):  # noqa: F811
    spec, path = setup
    path, rels, rows = copied(spec, spark, path)
    execute(spec.publisher, "ALTER PUBLICATION p1 DROP TABLE t1")
    assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 1
    assert "none of its publications publishes it now" in capsys.readouterr().err
    unchanged(spec, rels, rows)


def test_a_target_missing_a_column_changes_nothing(setup, spark, capsys):  # noqa: F811
    spec, path = setup
    path, _, _ = copied(spec, spark, path)
    execute(spec.subscriber, "ALTER TABLE t1 DROP COLUMN region")
    rels, rows = rel_rows(spec), table_rows(spec.subscriber, "t1")
    assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 1
    err = capsys.readouterr().err
    assert 'is missing replicated column: "region"' in err
    # The fix is the resync's own command again, not "the snapshot" (which leaves a table in r alone).
    assert "then run `rowfilter resync --table public.t1 --copy` again" in err, err
    assert "HINT:  fix the cause and run `rowfilter resync --table public.t1 --copy` again" in err, err
    assert "snapshot again" not in err
    unchanged(spec, rels, rows)


def test_a_table_locked_by_another_session_changes_nothing(setup, spark, capsys, monkeypatch):  # noqa: F811
    spec, path = setup
    path, rels, rows = copied(spec, spark, path)
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=300")
    with psycopg.connect(spec.subscriber) as reader:
        reader.execute("SELECT count(*) FROM t1")  # holds ACCESS SHARE until the end of its transaction
        assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 1
        assert "lock timeout" in capsys.readouterr().err
        reader.rollback()
    unchanged(spec, rels, rows)
    # Without --copy, the same lock: the same clean refusal, nothing changed.
    with psycopg.connect(spec.subscriber) as reader:
        reader.execute("SELECT count(*) FROM t1")
        assert cli.main(["resync", "--spec", path, "--table", "public.t1"]) == 1
        err = capsys.readouterr().err
        assert "cannot empty table public.t1" in err and "lock timeout" in err
        reader.rollback()
    unchanged(spec, rels, rows)


def test_a_snapshot_the_publisher_refuses_rolls_the_start_back(setup, spark, capsys, local_pg,  # noqa: F811
                                                               monkeypatch):
    """The last step before rows move: the publisher refuses the connection that creates the copy's
    snapshot (a role without REPLICATION may not start a WAL sender). Nothing was emptied or moved."""
    spec, path = setup
    role = f"norepl_{spec.subscription}"
    execute(spec.publisher, f"CREATE ROLE {role} LOGIN PASSWORD 'norepl-Pw-4'; "
                            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        publisher = spec.publisher.replace(f"//{local_pg.user}@", f"//{role}@")
        path, rels, rows = copied(spec, spark, path, publisher=publisher)
        monkeypatch.setenv("ROWFILTER_PUBLISHER_PASSWORD", "norepl-Pw-4")  # the role's, as the resync's publisher
        assert cli.main(["resync", "--spec", path, "--table", "public.t1", "--copy"]) == 1
        err = capsys.readouterr().err
        assert "cannot connect to the publisher" in err and "permission denied to start WAL sender" in err
        unchanged(spec, rels, rows)
    finally:
        execute(spec.publisher, f"DROP OWNED BY {role}; DROP ROLE {role}")


SEVERAL_READERS = """
import sys
from airflow_provider_rowfilter.core.relation import TableName
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.jobs.exit_status import run_job
from airflow_provider_rowfilter.flows.table_sync.sync import CopyOptions, resync
options = CopyOptions(max_partitions=2, min_pages=1)  # t1's few pages split in two: Spark runs the readers
sys.exit(run_job(lambda: resync(SubscriptionSpec.load(sys.argv[1]), [TableName("public", "t1")], copy=True,
                                options=options).ok and 0))
"""


def test_an_unusable_spark_master_changes_nothing(setup, spark, tmp_path):  # noqa: F811
    """A table read by several readers starts the job's Spark session before it changes."""
    spec, path = setup
    path, rels, rows = copied(spec, spark, path, spark_master="no-such-master://x")
    done = subprocess.run([sys.executable, "-c", SEVERAL_READERS, path], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "cannot start Spark with spark_master 'no-such-master://x'" in done.stderr, done.stderr[-2000:]
    unchanged(spec, rels, rows)


def _free_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"sc://127.0.0.1:{probe.getsockname()[1]}"


def test_a_spark_connect_server_that_does_not_answer_changes_nothing(setup, spark):  # noqa: F811
    """A table read by several readers asks for Spark before it changes; a Connect server that does not answer
    stops the job at once with the exit status Airflow retries (a later run may find it up)."""
    spec, path = setup
    url = _free_url()
    path, rels, rows = copied(spec, spark, path, spark_remote=url)
    done = subprocess.run([sys.executable, "-c", SEVERAL_READERS, path], capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_TRANSIENT, done.stderr[-2000:]
    assert f"no Spark Connect server answers at spark_remote '{url}'" in done.stderr
    unchanged(spec, rels, rows)


@pytest.mark.parametrize("unusable", ["spark_master", "spark_remote"])
def test_a_copy_by_one_reader_needs_no_spark(setup, spark, unusable):  # noqa: F811
    """A table read by one reader copies without Spark, as tablesync does: the unusable master is never
    started, the Connect server that does not answer never asked (flows/spark_on_demand.py SparkOnDemand)."""
    spec, path = setup
    setting = {"spark_master": "no-such-master://x"} if unusable == "spark_master" else {"spark_remote": _free_url()}
    path, _, _ = copied(spec, spark, path, **setting)
    exe = str(Path(sys.executable).parent / "rowfilter")
    done = subprocess.run([exe, "resync", "--spec", path, "--table", "public.t1", "--copy"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    published = "SELECT count(*), min(id), sum(v) FROM t1 WHERE id > 50"  # p1's filter of t1
    with psycopg.connect(spec.publisher, autocommit=True) as pub, \
            psycopg.connect(spec.subscriber, autocommit=True) as sub:
        assert sub.execute("SELECT count(*), min(id), sum(v) FROM t1").fetchone() == pub.execute(published).fetchone()
    assert [r[3] for r in rel_rows(spec) if r[2] == "t1"] == ["f"]
