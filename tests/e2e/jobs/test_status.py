"""``rowfilter status`` and the printing of data (issue 14, items 5, 10 and 12).

- The slot's WAL: ``wal_status``, the bytes it retains, a warning past ``retained_wal_warning``.
- A slot dropped outside the tool, or invalidated by ``max_slot_wal_keep_size``: the subscription
  is reported broken and status exits 3.
- A publisher that cannot be reached: status still prints the subscriber's side, the slot unknown.
- A conflicting key holding Rich markup (``[/x]``, ``[bold]``) is printed as it is, by the apply's
  error and by status.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import yaml

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from tests.e2e.jobs.databases import run_ours
from tests.e2e.jobs.snapshot_scenario import T1, T2, execute


def status(path: str, capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["status", "--spec", path, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def rewrite(path: str, **extra) -> str:
    doc = yaml.safe_load(Path(path).read_text())
    Path(path).write_text(yaml.safe_dump({**doc, **extra}))
    return path


def copied(spec: SubscriptionSpec, spark) -> None:
    execute(spec.subscriber, T1 + T2)
    run_ours(spec, spark)


def test_status_shows_the_slot_and_warns_past_the_threshold(setup, spark, capsys):  # noqa: F811
    spec, path = setup
    copied(spec, spark)
    code, out, err = status(path, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["broken"] is None and doc["warnings"] == [] and err == ""
    slot = doc["slot"]
    assert (slot["name"], slot["exists"], slot["wal_status"]) == (f"rowfilter_{spec.subscription}", True, "reserved")
    assert slot["retained_bytes"] >= 0 and slot["retained_wal_warning_bytes"] == 1024 ** 3
    assert [(t["table"], t["state"]) for t in doc["tables"]] == [("public.t1", "f"), ("public.t2", "f")]

    execute(spec.publisher, "INSERT INTO t2 SELECT g, 'x' FROM generate_series(100, 2000) g")
    rewrite(path, retained_wal_warning="64kB")
    code, out, err = status(path, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["slot"]["retained_bytes"] > 64 * 1024
    (warning,) = doc["warnings"]
    assert f'replication slot "rowfilter_{spec.subscription}" retains' in warning
    assert "more than retained_wal_warning (64.0 kB)" in warning and "WARNING:" in err and "retains" in err
    code, out, err = status(path, capsys)
    assert code == 0 and "wal_status reserved" in out and "of WAL" in out
    assert "more than retained_wal_warning" in err


def test_a_slot_dropped_outside_the_tool_is_reported_broken(setup, spark, capsys):  # noqa: F811
    spec, path = setup
    copied(spec, spark)
    execute(spec.publisher, f"SELECT pg_drop_replication_slot('rowfilter_{spec.subscription}')")
    code, out, err = status(path, capsys)
    assert code == cli.EXIT_BROKEN == 3
    assert "public.t1" in out and "missing on the publisher" in out
    flat = " ".join(err.split())
    assert f'BROKEN: replication slot "rowfilter_{spec.subscription}" does not exist on the publisher' in flat
    assert "public.t1, public.t2 are past the initial copy" in flat and "rowfilter refresh --help" in flat
    code, out, _ = status(path, capsys, "--json")
    doc = json.loads(out)
    assert code == 3 and doc["slot"]["exists"] is False and "does not exist" in doc["broken"]


def test_an_invalidated_slot_is_reported_broken_and_dropped(setup, spark, capsys, local_pg):  # noqa: F811
    """max_slot_wal_keep_size on the publisher: past it a checkpoint removes the WAL, the slot is lost; `rowfilter
    drop` drops it, saying it was invalidated."""
    spec, path = setup
    copied(spec, spark)
    admin = local_pg.dsn()
    execute(admin, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    try:
        execute(admin, "SELECT pg_reload_conf()")
        for _ in range(3):
            execute(spec.publisher, "INSERT INTO t2 SELECT g, repeat('x', 100) FROM generate_series(3000, 5000) g; "
                    "DELETE FROM t2 WHERE id >= 3000")
            execute(spec.publisher, "SELECT pg_switch_wal()")
        execute(spec.publisher, "CHECKPOINT")
        code, out, err = status(path, capsys, "--json")
    finally:
        execute(admin, "ALTER SYSTEM RESET max_slot_wal_keep_size")
        execute(admin, "SELECT pg_reload_conf()")
    doc = json.loads(out)
    assert doc["slot"]["wal_status"] == "lost", doc["slot"]
    assert code == 3 and "was invalidated by the publisher (wal_removed): the publisher removed WAL" in doc["broken"]
    assert "max_slot_wal_keep_size (1.0 MB)" in doc["broken"] and "refresh --recreate-slot" in doc["broken"]
    # `rowfilter drop` drops the useless slot and says what it was (no WAL "retained" by it).
    capsys.readouterr()
    assert cli.main(["drop", "--spec", str(path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (f"- replication slot rowfilter_{spec.subscription} on the publisher (the publisher had invalidated it: "
            "wal_removed; it held no change that could still be read, so dropping it lost nothing)") in said, said
    assert "retained" not in said, said
    assert not query_rows(spec.publisher, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                          (f"rowfilter_{spec.subscription}",))



def query_rows(dsn: str, statement: str, params: tuple) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def test_status_without_the_publisher_prints_the_subscriber_side(setup, spark, capsys):  # noqa: F811
    spec, path = setup
    copied(spec, spark)
    rewrite(path, publisher="postgresql://nobody@127.0.0.1:1/none")
    code, out, err = status(path, capsys)
    assert code == 0 and "public.t1" in out and "unknown (the publisher cannot be reached)" in out
    assert "cannot connect to the publisher" in err and "state is unknown" in err
    code, out, _ = status(path, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["slot"]["exists"] is None and "cannot connect" in doc["slot"]["error"]
    assert [t["lag_bytes"] for t in doc["tables"]] == [None, None]


KEY = "[/x] and [bold]k"


def test_a_conflicting_key_with_markup_is_printed_as_it_is(fresh_db, spark, capsys, tmp_path):
    pub, sub = fresh_db(), fresh_db()
    table = "CREATE TABLE k (id text PRIMARY KEY, v int);"
    execute(pub, table + "INSERT INTO k VALUES ('a', 1); CREATE PUBLICATION pk FOR TABLE k;")
    execute(sub, table)
    spec = SubscriptionSpec(subscription="markup", publisher=pub, subscriber=sub, publications=("pk",),
                            change_log=str(tmp_path / "changes"))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"subscription": "markup", "publisher": pub, "subscriber": sub,
                                    "publications": ["pk"], "change_log": str(tmp_path / "changes")}))
    run_ours(spec, spark)
    execute(sub, f"INSERT INTO k VALUES ('{KEY}', 0)")
    execute(pub, f"INSERT INTO k VALUES ('{KEY}', 1)")

    assert cli.main(["apply", "--spec", str(path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"Key (id)=({KEY}); existing local tuple ({KEY}, 0); remote tuple ({KEY}, 1)." in err, err
    lsn = re.search(r"finished at (\w+/\w+)\.", err).group(1)
    assert f"rowfilter skip --lsn {lsn}" in err  # the hint, whole

    code, out, err = status(str(path), capsys)
    assert code == 0
    assert KEY in " ".join(err.split()) and "last error:" in err
    code, out, _ = status(str(path), capsys, "--json")
    assert KEY in json.loads(out)["last_error"]


def test_status_shows_the_filtering_mode_per_table(setup, spark, capsys):
    spec, path = setup
    copied(spec, spark)
    code, out, _ = status(path, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["filtering"] == "source"
    assert {t["filtering"] for t in doc["tables"]} == {"source"}
    code, out, _ = status(rewrite(path, filtering="spark"), capsys, "--json")
    assert json.loads(out)["filtering"] == "spark"
    code, out, _ = status(path, capsys, "--format", "tsv")
    header, *rows = out.splitlines()
    column = header.split("\t").index("filtering")
    assert code == 0 and [r.split("\t")[column] for r in rows] == ["spark", "spark"]  # t1 and t2
