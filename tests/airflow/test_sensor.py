"""SubscriptionRelSensor and SubscriptionRelTrigger against real state tables in a fresh subscriber."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred
from airflow.sdk.module_loading import import_string

from airflow_provider_rowfilter.sensors.subscription_rel import SubscriptionRelSensor
from airflow_provider_rowfilter.triggers.subscription_rel import SubscriptionRelTrigger
from tests.airflow.support import StateDb


def sensor(db: StateDb, **kwargs: Any) -> SubscriptionRelSensor:
    kwargs.setdefault("poke_interval", 0.1)
    kwargs.setdefault("timeout", 30)
    return SubscriptionRelSensor(task_id="wait", subscription=db.subscription, subscriber_conn_id=db.conn_id,
                                 **kwargs)


def first_event(trigger: SubscriptionRelTrigger, timeout: float = 30) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(run(), timeout))


def later(seconds: float, action: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- poke ---------------------------------------------------------------------------------------------
def test_keeps_waiting_until_every_table_reaches_the_target(state_db: StateDb) -> None:
    s = sensor(state_db, target_state="f")
    assert not s.poke({})
    state_db.set_states(**{"public.t1": "f", "public.t2": "d"})
    assert not s.poke({})
    state_db.set_states(**{"public.t2": "f", "sales.t3": "r"})  # r is past f: it counts
    done = s.poke({})
    assert done
    assert done.xcom_value == {"public.t1": "f", "public.t2": "f", "sales.t3": "r"}


def test_target_ready_is_not_met_by_finished_copy(state_db: StateDb) -> None:
    state_db.set_states(**{"public.t1": "f", "public.t2": "s", "sales.t3": "r"})
    assert not sensor(state_db).poke({})
    state_db.set_states(**{"public.t1": "r", "public.t2": "r"})
    assert sensor(state_db, target_state="ready").poke({}).xcom_value == {
        "public.t1": "r", "public.t2": "r", "sales.t3": "r"}


def test_only_the_chosen_tables_count(state_db: StateDb) -> None:
    state_db.set_states(**{"public.t1": "f", "sales.t3": "f"})
    assert sensor(state_db, tables=["t1", "sales.t3"], target_state="f").poke({}).xcom_value == {
        "public.t1": "f", "sales.t3": "f"}
    assert not sensor(state_db, tables="public.t1,public.t2", target_state="f").poke({})


def test_poke_mode_returns_once_the_states_are_reached(state_db: StateDb) -> None:
    later(1.0, lambda: state_db.set_states(**{"public.t1": "f", "public.t2": "f", "sales.t3": "f"}))
    began = time.monotonic()
    assert sensor(state_db, target_state="f").execute({}) == {"public.t1": "f", "public.t2": "f", "sales.t3": "f"}
    assert time.monotonic() - began >= 0.9


def test_poke_mode_times_out_while_tables_are_behind(state_db: StateDb) -> None:
    state_db.set_states(**{"public.t1": "f"})
    with pytest.raises(AirflowSensorTimeout):
        sensor(state_db, target_state="f", timeout=1).execute({})


# --- fail fast ----------------------------------------------------------------------------------------
def test_recorded_table_error_fails_at_once_without_retry(state_db: StateDb) -> None:
    state_db.set_states(**{"public.t1": "d"})
    state_db.record_error("public.t1", 'duplicate key value violates unique constraint "t1_pkey" at 0/16B3748')
    began = time.monotonic()
    with pytest.raises(AirflowFailException) as e:
        sensor(state_db, target_state="f", poke_interval=30, timeout=120, retries=3).execute({})
    assert time.monotonic() - began < 10
    assert "public.t1" in str(e.value)
    assert 'duplicate key value violates unique constraint "t1_pkey" at 0/16B3748' in str(e.value)


def test_error_of_a_table_not_chosen_is_ignored(state_db: StateDb) -> None:
    state_db.set_states(**{"public.t1": "f"})
    state_db.record_error("public.t2", "copy failed")
    assert sensor(state_db, tables=["public.t1"], target_state="f").poke({})


def test_recorded_subscription_error_fails(state_db: StateDb) -> None:
    state_db.record_error(None, "replication slot rowfilter_s1 does not exist")
    with pytest.raises(AirflowFailException, match="replication slot rowfilter_s1 does not exist"):
        sensor(state_db).poke({})


def test_a_table_not_in_the_subscription_fails(state_db: StateDb) -> None:
    with pytest.raises(AirflowFailException, match=r"public\.nope not part of subscription 's1'") as e:
        sensor(state_db, tables=["public.t1", "nope"]).poke({})
    assert "public.t1, public.t2, sales.t3" in str(e.value)


def test_unknown_subscription_fails(state_db: StateDb) -> None:
    s = SubscriptionRelSensor(task_id="w", subscription="other", subscriber_conn_id=state_db.conn_id)
    with pytest.raises(AirflowFailException, match="subscription 'other' has no state in the subscriber"):
        s.poke({})


def test_subscriber_without_our_schema_fails(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> None:
    s = SubscriptionRelSensor(task_id="w", subscription="s1", subscriber_conn_id=airflow_conn(fresh_db()))
    with pytest.raises(AirflowFailException, match="RefreshPublicationOperator"):
        s.poke({})


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"target_state": "x"}, "target_state='x'"),
        ({"tables": [1, 2]}, "tables=[1, 2]"),
        ({"subscriber_conn_id": "rf_missing"}, "subscriber_conn_id='rf_missing': no such Airflow connection"),
    ],
    ids=["bad-state", "bad-tables", "missing-connection"],
)
def test_bad_settings_fail_naming_the_setting(state_db: StateDb, kwargs: dict[str, Any], setting: str) -> None:
    args = {"task_id": "w", "subscription": "s1", "subscriber_conn_id": state_db.conn_id, **kwargs}
    with pytest.raises(AirflowFailException) as e:
        SubscriptionRelSensor(**args).poke({})
    assert setting in str(e.value)


def test_connection_of_another_type_fails(state_db: StateDb, airflow_conn: Callable[..., str]) -> None:
    spark = airflow_conn({"conn_type": "spark", "host": "local[2]"}, "spark")
    with pytest.raises(AirflowFailException, match=f"subscriber_conn_id='{spark}' is a connection of type 'spark'"):
        SubscriptionRelSensor(task_id="w", subscription="s1", subscriber_conn_id=spark).poke({})


# --- deferrable: the trigger against the real database -------------------------------------------------
def test_trigger_serializes_and_round_trips(state_db: StateDb) -> None:
    trigger = SubscriptionRelTrigger(subscription="s1", subscriber_conn_id=state_db.conn_id,
                                     tables=["public.t1"], target_state="f", poke_interval=0.5)
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_rowfilter.triggers.subscription_rel.SubscriptionRelTrigger"
    assert kwargs == {"subscription": "s1", "subscriber_conn_id": state_db.conn_id, "tables": ["public.t1"],
                      "target_state": "f", "poke_interval": 0.5}
    again = import_string(path)(**kwargs)
    assert again.serialize() == (path, kwargs)


def test_trigger_fires_success_once_the_tables_get_there(state_db: StateDb) -> None:
    trigger = SubscriptionRelTrigger(subscription="s1", subscriber_conn_id=state_db.conn_id, target_state="f",
                                     poke_interval=0.2)
    later(1.0, lambda: state_db.set_states(**{"public.t1": "f", "public.t2": "r", "sales.t3": "f"}))
    assert first_event(trigger) == {"status": "success",
                                    "states": {"public.t1": "f", "public.t2": "r", "sales.t3": "f"}}


def test_trigger_fires_error_on_a_recorded_error(state_db: StateDb) -> None:
    state_db.record_error("sales.t3", "permission denied for table t3")
    event = first_event(SubscriptionRelTrigger(subscription="s1", subscriber_conn_id=state_db.conn_id,
                                               poke_interval=0.2))
    assert event["status"] == "error" and event["retryable"] is False
    assert "sales.t3: permission denied for table t3" in event["message"]


def test_trigger_fires_error_for_a_table_not_subscribed(state_db: StateDb) -> None:
    event = first_event(SubscriptionRelTrigger(subscription="s1", subscriber_conn_id=state_db.conn_id,
                                               tables=["public.t9"], poke_interval=0.2))
    assert event["status"] == "error" and event["retryable"] is False
    assert "public.t9 not part of subscription 's1'" in event["message"]


def test_trigger_reports_an_unreachable_subscriber_as_retryable(airflow_conn: Callable[..., str]) -> None:
    # A port nothing listens on: a real connection failure, nothing mocked.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conn_id = airflow_conn(f"postgresql://postgres@127.0.0.1:{port}/nowhere", "down")
    event = first_event(SubscriptionRelTrigger(subscription="s1", subscriber_conn_id=conn_id, poke_interval=0.2))
    assert event["status"] == "error" and event["retryable"] is True
    assert conn_id in event["message"]


def test_deferrable_sensor_defers_and_completes_with_the_trigger_event(state_db: StateDb) -> None:
    s = sensor(state_db, target_state="f", deferrable=True, poke_interval=0.2)
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({})
    assert deferred.value.method_name == "execute_complete"
    trigger = deferred.value.trigger
    assert isinstance(trigger, SubscriptionRelTrigger)
    later(0.5, lambda: state_db.set_states(**{"public.t1": "f", "public.t2": "f", "sales.t3": "f"}))
    event = first_event(trigger)
    assert s.execute_complete({}, event) == {"public.t1": "f", "public.t2": "f", "sales.t3": "f"}


def test_deferrable_sensor_fails_with_the_trigger_error(state_db: StateDb) -> None:
    s = sensor(state_db, target_state="f", deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({})
    state_db.record_error("public.t2", "out of memory")
    event = first_event(deferred.value.trigger)
    with pytest.raises(AirflowFailException, match="public.t2: out of memory"):
        s.execute_complete({}, event)


def test_deferrable_sensor_returns_at_once_when_already_there(state_db: StateDb) -> None:
    state_db.set_states(**{"public.t1": "f", "public.t2": "f", "sales.t3": "f"})
    assert sensor(state_db, target_state="f", deferrable=True).execute({}) == {
        "public.t1": "f", "public.t2": "f", "sales.t3": "f"}
