"""``schema_changes: follow``: the publisher's schema changes followed in the batch, beside native replication (issue 48).

Native replication replicates no DDL: the native subscriber gets each DDL by hand at the moment it
needs it (a column added before the first change that carries it, a rename once the changes under the
old name are applied). Ours runs once over the whole interleaved workload (one batch: the DDL in the
middle of it) and must end equal to the native subscriber and to the publisher's filtered rows.
Both capture modes (``filtering`` source: pgoutput judges; spark: the apply judges), on an 18 publisher (the run's
cluster) and a 15 one (Debian's, or ``$ROWFILTER_PG15_BIN_DIR``; started for this module only).
"""

from __future__ import annotations

import json
import re
import signal

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter import faults
from airflow_provider_rowfilter.cli.status import status
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.apply.schema_follow import SchemaChangeError
from airflow_provider_rowfilter.subscriber.state import StateReader
from airflow_provider_rowfilter.subscriber.target_table import ApplyTargetError
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
from airflow_provider_rowfilter.tooling.native import table_rows
from tests.e2e.jobs.apply_scenario import (
    PUBLICATIONS,
    PUBLISHER,
    SUBSCRIBER,
    Job,
    expected,
    frozen,
    publish,
    write_spec,
)
from tests.e2e.jobs.databases import FILTERING_MODES, Databases, names, run_ours
from tests.pg_versions import pg15_bin_dir


def _start(dbs, spark, tmp_path, mode="follow", filtering="source"):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    _, spec = write_spec(dbs, tmp_path, schema_changes=mode, filtering=filtering)
    run_ours(spec, spark)
    apply(spec, max_changes=100_000, spark=spark)
    return native, spec


def _same(dbs, native, table="t"):
    native.wait_caught_up()
    ours = table_rows(dbs.ours, table)
    assert ours == table_rows(dbs.native, table), f"{table} differs from native replication"
    assert ours == expected(dbs, table), f"{table} differs from the publisher's filtered rows"


def _history(dbs, spec) -> list:
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT schema_changes FROM rowfilter.batch_history WHERE subscription = %s AND schema_changes IS NOT NULL "
            "ORDER BY id", (spec.subscription,))]


@pytest.mark.parametrize("filtering", FILTERING_MODES)
def test_columns_added_between_changes_follow_in_the_batch_beside_native(dbs, spark, tmp_path, filtering):
    native, spec = _start(dbs, spark, tmp_path, filtering=filtering)
    # Native: the subscriber's columns must exist before the first change carrying them.
    publish(dbs.native, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7", "ALTER TABLE t ADD COLUMN note text"])
    publish(dbs.publisher, [
        "UPDATE t SET v = 'before' WHERE id = 1",
        "INSERT INTO t VALUES (901, 1, 'inserted before the add')",
        "ALTER TABLE t ADD COLUMN extra int DEFAULT 7",
        "ALTER TABLE t ADD COLUMN note text",
        "INSERT INTO t VALUES (902, 2, 'after the add', 8, 'n')",
        "UPDATE t SET extra = 9 WHERE id = 2",
        "DELETE FROM t WHERE id = 3",
    ])
    result = apply(spec, max_changes=100_000, spark=spark)
    assert result.batch_id is not None
    texts = result.schema_changes
    assert len(texts) == 2 and re.match(r"public\.t: added column extra \(integer\) at [0-9A-F]+/[0-9A-F]+$", texts[0]), texts
    assert texts[1].startswith("public.t: added column note (text) at"), texts
    _same(dbs, native)
    assert "(5,0,t5,7,)" in table_rows(dbs.ours, "t")  # a row the batch never touched: the publisher's default
    assert "(901,1,\"inserted before the add\",7,)" in table_rows(dbs.ours, "t")
    (recorded,) = _history(dbs, spec)
    assert [c["column"] for c in recorded] == ["extra", "note"] and recorded[0]["type"] == "integer"
    with psycopg.connect(dbs.ours, autocommit=True) as conn:  # what the Replication page reads
        (last, *_) = StateReader(conn, spec.subscription).overview().batches
    assert last.schema_changes is not None and last.schema_changes[0]["text"] == texts[0].removeprefix("public.t: ")
    _same(dbs, native, "u")


def test_default_stop_still_stops_at_an_added_column_and_status_shows_it(dbs, spark, tmp_path, capsys):
    _, spec = _start(dbs, spark, tmp_path, mode="stop")
    capsys.readouterr()
    assert status(spec, fmt="json") == 0
    assert json.loads(capsys.readouterr().out)["schema_differences"] == []
    publish(dbs.publisher, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7", "INSERT INTO t VALUES (902, 2, 'x', 8)",
                            "ALTER TABLE u ALTER COLUMN k TYPE bigint"])
    status(spec, fmt="json")
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_changes"] == "stop" and doc["schema_differences"] == [
        "public.t: column extra (integer) is on the publisher, not in the subscriber",
        "public.u: column k is bigint on the publisher, integer in the subscriber"], doc["schema_differences"]
    before = frozen(dbs, spec)
    with pytest.raises(ApplyTargetError, match='missing replicated column: "extra"'):
        apply(spec, max_changes=100_000, spark=spark)
    assert frozen(dbs, spec) == before


def test_types_widened_follow_and_a_narrowing_stops(dbs, spark, tmp_path):
    native, spec = _start(dbs, spark, tmp_path)  # the Spark path's widened staging: the 15 case below
    publish(dbs.native, ["ALTER TABLE t ALTER COLUMN grp TYPE bigint"])
    publish(dbs.publisher, ["UPDATE t SET v = 'before' WHERE id = 1",
                            "ALTER TABLE t ALTER COLUMN grp TYPE bigint",
                            "INSERT INTO t VALUES (903, 5000000000, 'wide')"])
    result = apply(spec, max_changes=100_000, spark=spark)
    assert [s.split(" at ")[0] for s in result.schema_changes] == ["public.t: changed column grp to bigint"]
    _same(dbs, native)
    publish(dbs.publisher, ["UPDATE t SET v = 'before' WHERE id = 2",
                            "ALTER TABLE t ALTER COLUMN v TYPE varchar(3) USING left(v, 3)",
                            "UPDATE t SET v = 'abc' WHERE id = 5"])
    before = frozen(dbs, spec)
    with pytest.raises(SchemaChangeError) as caught:
        apply(spec, max_changes=100_000, spark=spark)
    text = str(caught.value)
    assert re.search(r'column "v" changed from text to character varying\(3\) at [0-9A-F]+/', text), text
    assert "ALTER TABLE public.t ALTER COLUMN v TYPE character varying(3)" in text, text
    assert frozen(dbs, spec) == before


@pytest.mark.parametrize("mode", ["follow", "follow_drops"])
def test_a_dropped_column_is_kept_or_dropped(dbs, spark, tmp_path, mode):
    native, spec = _start(dbs, spark, tmp_path, mode=mode)
    publish(dbs.publisher, ["UPDATE t SET v = 'before the drop' WHERE id = 1",
                            "ALTER TABLE t DROP COLUMN v",
                            "INSERT INTO t VALUES (904, 4)",
                            "UPDATE t SET grp = 3 WHERE id = 2"])
    result = apply(spec, max_changes=100_000, spark=spark)
    native.wait_caught_up()
    if mode == "follow_drops":
        publish(dbs.native, ["ALTER TABLE t DROP COLUMN v"])  # by hand, once the changes that had it are in
        assert [s.split(" at ")[0] for s in result.schema_changes] == ["public.t: dropped column v"]
        _same(dbs, native)
    else:
        assert result.schema_changes == []
        assert table_rows(dbs.ours, "t") == table_rows(dbs.native, "t")  # both keep v
        assert '(1,1,"before the drop")' in table_rows(dbs.ours, "t")


def test_a_column_renamed_follows_by_its_place_and_number(dbs, spark, tmp_path):
    native, spec = _start(dbs, spark, tmp_path)  # on the Spark path: the filter column renamed below
    publish(dbs.publisher, ["UPDATE t SET v = 'under the old name' WHERE id = 1"])
    apply(spec, max_changes=100_000, spark=spark)
    native.wait_caught_up()
    publish(dbs.native, ["ALTER TABLE t RENAME COLUMN v TO v2"])
    publish(dbs.publisher, ["ALTER TABLE t RENAME COLUMN v TO v2",
                            "INSERT INTO t VALUES (905, 1, 'under the new name')",
                            "UPDATE t SET v2 = 'renamed' WHERE id = 2"])
    result = apply(spec, max_changes=100_000, spark=spark)
    assert [s.split(" at ")[0] for s in result.schema_changes] == ["public.t: renamed column v to v2"]
    _same(dbs, native)
    with psycopg.connect(dbs.ours, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t WHERE v2 IS NOT NULL").fetchone()[0] > 100  # values kept


#: Every point a batch that follows a schema change passes (capture-mid-read needs a bigger segment: test_apply_faults).
KILL_POINTS = tuple(p for p in (*faults.POINTS[:3], *faults.SCHEMA_POINTS, *faults.POINTS[3:]) if p != "capture-mid-read")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_killed_around_the_schema_change_then_rerun_matches_native(dbs, spark, tmp_path, point):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    job = Job(dbs, tmp_path, "source")
    spec = yaml.safe_load(job.spec_path.read_text())
    job.spec_path.write_text(yaml.safe_dump({**spec, "schema_changes": "follow"}))
    run_ours(job.spec, spark)
    job.initial_slot = job.slot_position()
    publish(dbs.native, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7"])
    publish(dbs.publisher, ["INSERT INTO t VALUES (901, 1, 'before')", "ALTER TABLE t ADD COLUMN extra int DEFAULT 7",
                            "INSERT INTO t VALUES (902, 2, 'after', 8)", "UPDATE t SET extra = 9 WHERE id = 2"])
    before = job.ours()
    killed = job.run(fault=point)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-4000:])
    if point != "apply-after-commit":
        assert job.ours() == before  # the DDL rolled back with the batch (or never ran)
        with psycopg.connect(dbs.ours, autocommit=True) as conn:
            assert "extra" not in [r[0] for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 't'::regclass AND attnum > 0")]
    done = job.run()
    assert done.returncode == 0, done.stderr[-4000:]
    _same(dbs, native)
    _same(dbs, native, "u")
    assert len(_history(dbs, job.spec)) == 1  # followed once


@pytest.mark.parametrize("filtering", FILTERING_MODES)
def test_a_filter_column_renamed_follows_in_the_definitions_too(dbs, spark, tmp_path, filtering):
    # u's filter reads n: PostgreSQL's stored filter follows the rename (by attribute number); so must the definitions
    # the apply judges by (filtering: spark), in this batch and in the next ones, until a refresh records the new name.
    native, spec = _start(dbs, spark, tmp_path, filtering=filtering)
    publish(dbs.publisher, ["UPDATE u SET n = 60 WHERE k = 10"])  # enters the filter
    apply(spec, max_changes=100_000, spark=spark)
    native.wait_caught_up()
    publish(dbs.native, ["ALTER TABLE u RENAME COLUMN n TO n2"])
    publish(dbs.publisher, ["ALTER TABLE u RENAME COLUMN n TO n2",
                            "INSERT INTO u VALUES (700, 'a', 99)",     # passes the filter
                            "INSERT INTO u VALUES (701, 'a', 1)",      # does not
                            "UPDATE u SET n2 = 97 WHERE k = 11"])      # enters it
    result = apply(spec, max_changes=100_000, spark=spark)
    assert [s.split(" at ")[0] for s in result.schema_changes] == ["public.u: renamed column n to n2"]
    _same_renamed(dbs, native)
    publish(dbs.publisher, ["UPDATE u SET n2 = 5 WHERE k = 700", "INSERT INTO u VALUES (702, 'b', 70)"])  # leaves; new
    result = apply(spec, max_changes=100_000, spark=spark)
    assert result.batch_id is not None and result.schema_changes == []
    _same_renamed(dbs, native)
    assert "(702,b,70)" in table_rows(dbs.ours, "u") and not any(r.startswith("(700,") for r in table_rows(dbs.ours, "u"))


def _same_renamed(dbs, native):
    native.wait_caught_up()
    ours = table_rows(dbs.ours, "u")
    assert ours == table_rows(dbs.native, "u")
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        assert ours == sorted(r[0] for r in conn.execute("SELECT x::text FROM u x WHERE n2 > 50 AND s <> 'c'"))


@pytest.fixture(scope="module")
def local_pg15():
    with LocalPostgres.start(bin_dir=pg15_bin_dir()) as pg:
        assert pg.version_num // 10000 == 15
        yield pg


@pytest.fixture
def dbs15(local_pg15, tmp_path):
    made = [f"s15_{role}_{next(names)}" for role in ("pub", "native", "ours")]
    databases = Databases(*(local_pg15.create_database(name) for name in made), change_logs=tmp_path)
    yield databases
    for native in databases.natives:
        native.drop()
    for name in reversed(made):
        local_pg15.drop_database(name)


@pytest.mark.parametrize("filtering", FILTERING_MODES)
def test_on_a_postgresql15_publisher_columns_added_widened_and_renamed_follow_beside_native(dbs15, spark, tmp_path,
                                                                                           filtering):
    dbs = dbs15
    native, spec = _start(dbs, spark, tmp_path, filtering=filtering)
    with psycopg.connect(dbs.publisher, autocommit=True) as conn:
        assert conn.info.server_version // 10000 == 15
    publish(dbs.native, ["ALTER TABLE t ADD COLUMN extra int DEFAULT 7", "ALTER TABLE t ALTER COLUMN grp TYPE bigint"])
    publish(dbs.publisher, ["UPDATE t SET v = 'before' WHERE id = 1",
                            "ALTER TABLE t ADD COLUMN extra int DEFAULT 7",
                            "ALTER TABLE t ALTER COLUMN grp TYPE bigint",
                            "INSERT INTO t VALUES (902, 5000000000, 'after', 8)",
                            "UPDATE u SET n = 60 WHERE k = 10"])
    result = apply(spec, max_changes=100_000, spark=spark)
    assert sorted(s.split(" at ")[0] for s in result.schema_changes) == [  # one relation: in the columns' order
        "public.t: added column extra (integer)", "public.t: changed column grp to bigint"]
    _same(dbs, native)
    native.wait_caught_up()
    publish(dbs.native, ["ALTER TABLE u RENAME COLUMN n TO n2"])
    publish(dbs.publisher, ["ALTER TABLE u RENAME COLUMN n TO n2", "INSERT INTO u VALUES (700, 'a', 99)",
                            "UPDATE u SET n2 = 97 WHERE k = 11"])
    result = apply(spec, max_changes=100_000, spark=spark)
    assert [s.split(" at ")[0] for s in result.schema_changes] == ["public.u: renamed column n to n2"]
    _same_renamed(dbs, native)
