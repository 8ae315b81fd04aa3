"""SubscriptionLagCheckOperator against a real slot and real state tables; metrics through Airflow's StatsD logger."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.operators.metrics import apply_metrics
from airflow_provider_rowfilter.operators.subscription_lag import SubscriptionLagCheckOperator
from tests.airflow.support import StateDb, StatsdReceiver


@pytest.fixture
def publisher(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> Iterator[tuple[str, str]]:
    """A publisher database holding subscription s1's slot (rowfilter_s1), 2 MB of WAL behind its position."""
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('rowfilter_s1', 'pgoutput')")
        conn.execute("CREATE TABLE filler (id int, pad text)")
        conn.execute("INSERT INTO filler SELECT g, repeat('x', 200) FROM generate_series(1, 10000) g")
    try:
        yield dsn, airflow_conn(dsn, "pub")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('rowfilter_s1')")


def check(db: StateDb, **kwargs) -> SubscriptionLagCheckOperator:
    return SubscriptionLagCheckOperator(task_id="check_lag", subscription=db.subscription,
                                        subscriber_conn_id=db.conn_id, **kwargs)


def record_batch(db: StateDb, age: dt.timedelta) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO rowfilter.batch_history (subscription, end_lsn, changes, lag_seconds, finished_at) "
                     "VALUES (%s, '0/16B3748', 5, 0.7, now() - %s)", (db.subscription, age))


def test_retained_wal_past_the_threshold_fails_and_names_the_sizes(state_db: StateDb, publisher: tuple[str, str],
                                                                   statsd: StatsdReceiver) -> None:
    _, pub_conn = publisher
    with pytest.raises(AirflowFailException) as e:
        check(state_db, publisher_conn_id=pub_conn, max_retained_wal="64kB").execute({})
    message = str(e.value)
    assert message.startswith("subscription 's1' is behind: its slot \"rowfilter_s1\" holds back "), message
    assert "more than max_retained_wal (64.0 kB)" in message
    sent = statsd.received()
    retained = float(sent["airflow.rowfilter.s1.retained_wal_bytes"][0].split("|")[0])
    assert retained > 1024 * 1024  # the 10,000 rows of 200 bytes written after the slot

    result = check(state_db, publisher_conn_id=pub_conn, max_retained_wal="1GB").execute({})
    assert result["retained_wal_bytes"] >= retained and result["wal_status"] == "reserved"
    assert result["problems"] == [] and result["batch_age_seconds"] is None  # no batch yet: age not checked


def test_a_missing_slot_fails(state_db: StateDb, fresh_db: Callable[..., str],
                              airflow_conn: Callable[..., str]) -> None:
    empty = airflow_conn(fresh_db(), "pub")
    with pytest.raises(AirflowFailException, match='its replication slot "rowfilter_s1" does not exist on the '
                                                   r"publisher \(see `rowfilter refresh --recreate-slot`\)"):
        check(state_db, publisher_conn_id=empty, max_retained_wal=None).execute({})


def test_an_old_last_batch_fails_and_a_recent_one_passes(state_db: StateDb, statsd: StatsdReceiver) -> None:
    with pytest.raises(AirflowFailException, match="no batch has been applied yet"):
        check(state_db, max_batch_age=600).execute({})
    record_batch(state_db, dt.timedelta(hours=1))
    with pytest.raises(AirflowFailException) as e:
        check(state_db, max_batch_age=dt.timedelta(minutes=10)).execute({})
    assert "its last batch was applied 1 h ago" in str(e.value), str(e.value)
    assert "more than max_batch_age (10 min)" in str(e.value)
    result = check(state_db, max_batch_age=7200).execute({})
    assert 3590 < result["batch_age_seconds"] < 3700 and result["last_batch_lag_seconds"] == 0.7
    ages = [float(v.split("|")[0]) for v in statsd.received()["airflow.rowfilter.s1.batch_age_seconds"]]
    assert len(ages) == 2 and all(3590 < a < 3700 for a in ages)


def test_bad_thresholds_fail_naming_the_setting(state_db: StateDb) -> None:
    with pytest.raises(AirflowFailException, match="max_retained_wal = 'lots' is not a size"):
        check(state_db, max_retained_wal="lots").execute({})
    with pytest.raises(AirflowFailException, match="max_batch_age=-5 is not a positive number of seconds"):
        check(state_db, max_batch_age=-5).execute({})


def test_apply_metrics_name_the_subscription_and_the_table(statsd: StatsdReceiver) -> None:
    apply_metrics({"subscription": "s1", "changes": 12, "transactions": 3, "duration_ms": 850, "lag_bytes": 0,
                   "lag_seconds": 0.4, "counts": {"public.Order Items": {"insert": 2, "filtered": 1, "update": 0}}})
    sent = statsd.received()
    assert sent["airflow.rowfilter.s1.apply.runs"] == ["1|c"]
    assert sent["airflow.rowfilter.s1.apply.changes"] == ["12|c"]
    assert sent["airflow.rowfilter.s1.apply.duration"] == ["850.000000|ms"]
    assert sent["airflow.rowfilter.s1.lag_bytes"] == ["0|g"] or sent["airflow.rowfilter.s1.lag_bytes"] == ["0.0|g"]
    assert sent["airflow.rowfilter.s1.public.Order_Items.insert"] == ["2|c"]
    assert sent["airflow.rowfilter.s1.public.Order_Items.filtered"] == ["1|c"]
    assert "airflow.rowfilter.s1.public.Order_Items.update" not in sent  # nothing to count


def test_a_failed_apply_run_is_counted_and_its_lag_still_measured(state_db: StateDb, publisher: tuple[str, str],
                                                                  statsd: StatsdReceiver) -> None:
    """Issue 29 item 10: failures are counted, and the gauges keep coming from the runs that fail."""
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    _, pub_conn = publisher
    record_batch(state_db, dt.timedelta(minutes=30))
    apply = ApplyChangesOperator(task_id="apply", subscription="s1", publications=["p1"], publisher_conn_id=pub_conn,
                                 subscriber_conn_id=state_db.conn_id, time_budget="soon")
    with pytest.raises(AirflowFailException, match="time_budget='soon' is not a number of seconds"):
        apply.execute({})
    sent = statsd.received()
    assert sent["airflow.rowfilter.s1.apply.failures"] == ["1|c"] and "airflow.rowfilter.s1.apply.runs" not in sent
    assert 1790 < float(sent["airflow.rowfilter.s1.batch_age_seconds"][0].split("|")[0]) < 1900
    assert float(sent["airflow.rowfilter.s1.retained_wal_bytes"][0].split("|")[0]) > 1024 * 1024


def test_a_standby_not_ready_to_take_over_the_slot_fails_the_check(state_db: StateDb, publisher: tuple[str, str],
                                                                    fresh_db: Callable[..., str],
                                                                    airflow_conn: Callable[..., str]) -> None:
    """``standby_conn_ids``: each standby's readiness (publisher/readiness.py); here a server that is no standby,
    and a slot that is no failover slot, each named with its fix."""
    _, pub_conn = publisher
    not_a_standby = airflow_conn(fresh_db(), "standby")
    with pytest.raises(AirflowFailException) as e:
        check(state_db, publisher_conn_id=pub_conn, max_retained_wal=None, standby_conn_ids=[not_a_standby]).execute({})
    message = str(e.value)
    assert f"standby {not_a_standby} is not ready to take over its slot" in message, message
    assert 'replication slot "rowfilter_s1" is not a failover slot: `rowfilter refresh` makes it one' in message
    assert "it is not a standby (pg_is_in_recovery() is false)" in message, message


def test_a_table_stuck_in_i_d_or_f_fails_naming_it_and_its_state_unless_its_copy_runs(state_db: StateDb) -> None:
    """LSN lag alone passes while a table never replicates: a table in i, d or f past max_sync_age fails the check,
    named with its state, how long, its last error and what moves it on; one whose copy holds its lock is at work."""
    state_db.set_states(**{"public.t1": "d", "public.t2": "f"})
    state_db.record_error("public.t1", "table public.t1: duplicate key value violates unique constraint")
    assert check(state_db).execute({})["stuck_tables"] == []  # just entered: within the default hour
    with psycopg.connect(state_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE rowfilter.subscription_rel SET state_since = now() - interval '2 hours'")
        with pytest.raises(AirflowFailException) as e:
            check(state_db, max_sync_age=dt.timedelta(minutes=30)).execute({})
        said = str(e.value)
        assert "subscription 's1' is behind: 3 table(s) not replicating for more than max_sync_age (30 min)" in said, said
        assert "public.t1 in state d (data copy) for 2 h" in said, said
        assert "its last error: table public.t1: duplicate key value violates unique constraint" in said, said
        assert "public.t2 in state f (finished copy) for 2 h" in said and "the apply catches it up" in said, said
        assert "sales.t3 in state i (init) for 2 h" in said and "the snapshot copies it" in said, said
        # A copy of t1 at work holds its job lock (subscriber/state.py job_lock_key): not stuck.
        conn.execute("SELECT pg_advisory_lock(hashtext('rowfilter:s1'), hashtext('public.t1'))")
        with pytest.raises(AirflowFailException) as e:
            check(state_db).execute({})
        assert "2 table(s) not replicating" in str(e.value) and "public.t1" not in str(e.value), str(e.value)
        conn.execute("SELECT pg_advisory_unlock_all()")
    state_db.set_states(**{"public.t1": "r", "public.t2": "r", "sales.t3": "r"})
    assert check(state_db, max_sync_age=60).execute({})["stuck_tables"] == []  # r: replicating
    with pytest.raises(AirflowFailException, match="max_sync_age=0 is not a positive number of seconds"):
        check(state_db, max_sync_age=0).execute({})
