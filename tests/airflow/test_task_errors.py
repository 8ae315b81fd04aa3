"""A task's error in Airflow's terms (issue 29, item 6): the DAG to trigger instead of the command to type, the
connection id beside the host, and one frame of ours after the message."""

from __future__ import annotations

import socket
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_rowfilter.core.errors import UnreachableError
from airflow_provider_rowfilter.dag_factory import build_dags
from airflow_provider_rowfilter.hooks.rowfilter import RowFilterHook
from airflow_provider_rowfilter.operators.subscription_ops import SkipTransactionOperator
from airflow_provider_rowfilter.operators.task_errors import clear_errors, in_airflow_terms

HINT = ("HINT:  remove or change the subscriber's row and run again; or skip the whole remote transaction with "
        "`rowfilter skip --lsn 0/1A2B3C8` (ALTER SUBSCRIPTION … SKIP); or set conflict_policy: upsert")


@pytest.fixture
def factory_task(tmp_path: Path):
    path = tmp_path / "orders.yaml"
    path.write_text("subscription: orders\npublisher_conn_id: p\nsubscriber_conn_id: s\npublications: [p1]\n")
    return build_dags(path)["rowfilter_orders_incremental_sync"].get_task("apply"), path


def test_in_a_factory_dag_a_command_becomes_the_dag_to_trigger(factory_task) -> None:
    task, path = factory_task
    assert in_airflow_terms(task, HINT).endswith(
        "skip the whole remote transaction with the DAG rowfilter_orders_skip_transaction (Trigger DAG with lsn = "
        "0/1A2B3C8) (ALTER SUBSCRIPTION … SKIP); or set conflict_policy: upsert")
    assert in_airflow_terms(task, "copy it again with `rowfilter resync --table public.t1 --copy`") == \
        'copy it again with the DAG rowfilter_orders_resync_tables (Trigger DAG with tables = ["public.t1"], ' \
        'confirm_empty = true (it empties them))'
    # A repair in place is the reconcile DAG, never the one that empties.
    assert in_airflow_terms(task, "`rowfilter resync --reconcile --table public.t1`") == \
        'the DAG rowfilter_orders_reconcile_tables (Trigger DAG with tables = ["public.t1"])'
    assert in_airflow_terms(task, "`rowfilter reconcile --table public.t1`") == \
        'the DAG rowfilter_orders_reconcile_tables (Trigger DAG with tables = ["public.t1"])'
    assert in_airflow_terms(task, "`rowfilter enable` resumes it") == \
        "the DAG rowfilter_orders_enable_subscription resumes it"
    assert in_airflow_terms(task, "`rowfilter drop --keep-slot`") == \
        "the DAG rowfilter_orders_drop_subscription (Trigger DAG with confirm = the subscription's name, keep_slot = true)"
    assert in_airflow_terms(task, "run `rowfilter refresh` first") == "run the DAG rowfilter_orders_refresh first"
    # The lost slot's repair: the refresh DAG's parameters.
    assert in_airflow_terms(task, "run `rowfilter refresh --recreate-slot --reconcile`") == \
        "run the DAG rowfilter_orders_refresh (Trigger DAG with recreate_slot = true, reconcile = true)"
    # No DAG does it: the command, with the file, for a shell where Airflow's connections are.
    assert in_airflow_terms(task, "run `rowfilter sync-sequences --dry-run`") == \
        f"run `rowfilter sync-sequences --spec {path.resolve()} --dry-run`"


def test_elsewhere_the_command_gets_the_spec_file(tmp_path: Path) -> None:
    with DAG(dag_id="mine", schedule=None):
        task = SkipTransactionOperator(task_id="skip", spec="/etc/rowfilter/s1.yaml", lsn="0/1")
    assert in_airflow_terms(task, HINT).endswith(
        "`rowfilter skip --spec /etc/rowfilter/s1.yaml --lsn 0/1A2B3C8` (ALTER SUBSCRIPTION … SKIP); or set "
        "conflict_policy: upsert")


def test_one_frame_of_ours_after_the_message(factory_task) -> None:
    task, _ = factory_task

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        try:
            raise ValueError("the job's own chain")
        except ValueError as e:
            raise AirflowFailException("apply: conflict\n" + HINT) from e

    failing = clear_errors(lambda self: deep(8))
    with pytest.raises(AirflowFailException) as caught:
        failing(task)
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert [f.name for f in frames] == ["test_one_frame_of_ours_after_the_message", "wrapper"]
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "rowfilter_orders_skip_transaction (Trigger DAG with lsn = 0/1A2B3C8)" in str(caught.value)


def test_an_unreachable_database_is_named_by_its_connection_id(airflow_conn: Callable[..., str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn_id = airflow_conn(f"postgresql://nobody@127.0.0.1:{port}/db", "gone")
    with pytest.raises(UnreachableError) as caught:
        RowFilterHook.endpoint(conn_id, "subscriber").connect(connect_timeout=5)
    assert str(caught.value).startswith(
        f"cannot connect to the subscriber at host 127.0.0.1 (Airflow connection '{conn_id}')"), str(caught.value)
    assert "DETAIL:" in str(caught.value)
