"""Origins (issue 35 item 2): ``origin: none`` passed to pgoutput, and the apply's writes tagged with a replication origin.

Three databases of the session's cluster (PostgreSQL 18; again on the PostgreSQL 16 one): A, B (ours subscribes
B to A) and C (a native subscription to B). One scenario, cheap (no Spark: ``copy_data: false``, the publisher filters and the
batches are reduced in this process):

- a two-way pair A ⇄ B: ours A → B with ``origin: none``, a native subscription B → A with ``origin = none``.
  A row written in A reaches B once and does not come back (native B → A skips our tagged writes); a row
  written in B reaches A once and does not come back (our capture asks A's pgoutput for origin none). A loop
  would show as an ``insert_exists`` conflict on one side;
- a cascade A → ours → C, C with ``origin = none``: C gets B's local writes and none of ours;
- ``pg_replication_origin_status`` shows our origin's progress; DROP SUBSCRIPTION drops it;
- a publisher before 16 is refused (``SubscriptionSpec.origin_option``: no server here is older than 18).
"""

from __future__ import annotations

import time

import psycopg
import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from airflow_provider_rowfilter.flows.drop import drop
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.subscriber.replication_origin import origin_name
from airflow_provider_rowfilter.tooling.native import NativeSubscription, table_rows

TABLE = "CREATE TABLE t (id int PRIMARY KEY, v text);"


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def wait_rows(dsn: str, expected: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (rows := table_rows(dsn, "t")) != expected:
        assert time.monotonic() < deadline, f"{dsn}: {rows} != {expected}"
        time.sleep(0.1)


@pytest.mark.parametrize("databases", ["fresh_db", "fresh_db16"], ids=["pg18", "pg16"])
def test_two_way_pair_does_not_loop_and_a_cascade_with_origin_none_skips_our_writes(databases, request, tmp_path):
    began = time.monotonic()
    make = request.getfixturevalue(databases)  # PostgreSQL 18, or 16: the first with origin
    a, b, c = make(), make(), make()
    execute(a, TABLE, "CREATE PUBLICATION pa FOR TABLE t")
    execute(b, TABLE, "CREATE PUBLICATION pb FOR TABLE t")
    execute(c, TABLE)
    spec = SubscriptionSpec(subscription=f"origin_ab_{databases}", publisher=a, subscriber=b, publications=("pa",),
                            copy_data=False, origin="none", change_log=str(tmp_path / "changes"))
    refresh(spec)
    back = NativeSubscription(b, a, "origin_ba", ["pb"], {"origin": "none", "copy_data": "false"}).create()
    cascade = NativeSubscription(b, c, "origin_bc", ["pb"], {"origin": "none", "copy_data": "false"}).create()
    try:
        execute(a, "INSERT INTO t VALUES (1, 'written in A')")
        execute(b, "INSERT INTO t VALUES (2, 'written in B')")
        wait_rows(a, ["(1,\"written in A\")", "(2,\"written in B\")"])  # B's row reached A natively
        result = apply(spec)
        # Ours brought A's row to B, and not B's own row back from A (A's pgoutput skipped it: origin none).
        assert result.tables == {"public.t": {"insert": 1}}, result.tables
        both = ["(1,\"written in A\")", "(2,\"written in B\")"]
        assert table_rows(b, "t") == both
        execute(a, "UPDATE t SET v = v || ' again' WHERE id = 1")
        assert apply(spec).tables == {"public.t": {"update": 1}}
        back.wait_caught_up()
        cascade.wait_caught_up()
        # Native B → A skipped our tagged writes: A holds its own rows, no conflict stopped its worker.
        assert table_rows(a, "t") == ["(1,\"written in A again\")", "(2,\"written in B\")"]
        with psycopg.connect(a, autocommit=True) as conn:
            assert conn.execute("SELECT apply_error_count FROM pg_stat_subscription_stats "
                                "WHERE subname = 'origin_ba'").fetchone()[0] == 0
        # C (origin = none from B) got B's local row only: ours are replicated writes.
        assert table_rows(c, "t") == ["(2,\"written in B\")"]
        # Nothing comes back to ours either: a further run finds no change.
        assert apply(spec).changes == 0
        with psycopg.connect(b, autocommit=True) as conn:
            progress = conn.execute("SELECT remote_lsn > '0/0' FROM pg_replication_origin_status s "
                                    "JOIN pg_replication_origin o ON o.roident = s.local_id "
                                    "WHERE o.roname = %s", (origin_name(conn, spec.subscription),)).fetchone()
        assert progress == (True,)
    finally:
        cascade.drop()
        back.drop()
    drop(spec)
    with psycopg.connect(b, autocommit=True) as conn:
        assert conn.execute("SELECT pg_replication_origin_oid(%s)", (origin_name(conn, spec.subscription),)).fetchone()[0] \
            is None
    print(f"origins scenario ({databases}): {time.monotonic() - began:.1f} s")


@pytest.mark.parametrize(("origin", "version", "sent"), [("any", 150000, None), ("any", 160000, "any"),
                                                          ("none", 180000, "none")])
def test_origin_option_as_the_walreceiver_sends_it(origin, version, sent):
    spec = SubscriptionSpec(subscription="s1", publisher="host=h", subscriber="host=h", publications=("p",),
                            origin=origin)
    assert spec.origin_option(version) == sent


def test_origin_none_is_refused_before_postgresql_16():
    spec = SubscriptionSpec(subscription="s1", publisher="host=h", subscriber="host=h", publications=("p",),
                            origin="none")
    with pytest.raises(SpecError, match="origin = none needs a publisher of PostgreSQL 16 or later; this one is "
                                        "PostgreSQL 15") as caught:
        spec.origin_option(150004)
    assert "unrecognized pgoutput option: origin" in str(caught.value)


def test_validate_and_status_warn_when_the_subscriber_nears_max_active_replication_origins(fresh_db, tmp_path,
                                                                                           capsys):
    """Issue 46: origins left behind count against the cluster's limit (PostgreSQL 18); validate and status say so
    from 80 % of it, before a native subscription stops catching up."""
    import yaml

    from airflow_provider_rowfilter import cli

    pub, sub = fresh_db(), fresh_db()
    execute(pub, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION p FOR TABLE t")
    execute(sub, "CREATE TABLE t (id int PRIMARY KEY)")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"subscription": "origins", "publisher": pub, "subscriber": sub,
                                    "publications": ["p"], "change_log": str(tmp_path / "log")}))
    refresh(SubscriptionSpec.load(path))
    with psycopg.connect(sub, autocommit=True) as conn:
        limit = int(conn.execute("SHOW max_active_replication_origins").fetchone()[0])
        count = conn.execute("SELECT count(*) FROM pg_replication_origin").fetchone()[0]
    assert cli.main(["status", "--spec", str(path)]) == 0
    assert "replication origins of max_active_replication_origins" not in capsys.readouterr().err
    left = [f"rowfilter_0_left_{n}" for n in range(max(limit - 2, -(-limit * 8 // 10)) - count)]
    try:
        with psycopg.connect(sub, autocommit=True) as conn:
            for name in left:  # as drops without the GRANT left them
                conn.execute("SELECT pg_replication_origin_create(%s)", (name,))
        for command in ("status", "validate"):
            assert cli.main([command, "--spec", str(path)]) == 0
            err = " ".join(capsys.readouterr().err.split())
            assert f"replication origins of max_active_replication_origins = {limit}" in err, (command, err)
            assert "ours: rowfilter_0_left_0" in err and "SELECT pg_replication_origin_drop(name)" in err
    finally:
        with psycopg.connect(sub, autocommit=True) as conn:
            for name in left:
                conn.execute("SELECT pg_replication_origin_drop(%s)", (name,))
