"""An apply with no subscription to serve is skipped, saying why (issue 29 items 4, 5 and 9); one whose state is
missing while its slot exists is not. ApplyChangesOperator on real subscriber and publisher databases."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
from airflow_provider_rowfilter.subscriber.state import StateStore
from tests.airflow.support import StateDb


def apply(subscriber_conn_id: str, publisher_conn_id: str, subscription: str = "s1") -> ApplyChangesOperator:
    return ApplyChangesOperator(task_id="apply", subscription=subscription, publications=["p1"],
                                publisher_conn_id=publisher_conn_id, subscriber_conn_id=subscriber_conn_id)


@pytest.fixture
def publisher(fresh_db: Callable[..., str], airflow_conn: Callable[..., str]) -> tuple[str, str]:
    dsn = fresh_db()
    return dsn, airflow_conn(dsn, "pub")


def test_before_the_initial_sync_a_run_is_skipped(fresh_db: Callable[..., str], airflow_conn: Callable[..., str],
                                                  publisher: tuple[str, str]) -> None:
    subscriber = airflow_conn(fresh_db(), "sub")
    with pytest.raises(AirflowSkipException, match=r"subscription 's1' is not subscribed yet \(no state in the "
                                                   r"subscriber, no slot on the publisher\)"):
        apply(subscriber, publisher[1]).execute({})


def test_without_state_but_with_a_slot_it_fails(fresh_db: Callable[..., str], airflow_conn: Callable[..., str],
                                                publisher: tuple[str, str]) -> None:
    """The state was lost, or the connection names the wrong database, while the slot holds WAL: an alert."""
    pub, pub_conn = publisher
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('rowfilter_s1', 'pgoutput')")
    subscriber = airflow_conn(fresh_db(), "sub")
    with pytest.raises(AirflowFailException, match="subscription 's1' has no state in the subscriber"):
        apply(subscriber, pub_conn).execute({})


def test_a_dropped_subscription_is_skipped_saying_when(state_db: StateDb, publisher: tuple[str, str]) -> None:
    with psycopg.connect(state_db.dsn) as conn, conn.transaction():
        StateStore(conn, "s1").drop()
    with pytest.raises(AirflowSkipException, match=r"subscription 's1' was dropped at \d{4}-\d\d-\d\d "
                                                   r"\d\d:\d\d:\d\d UTC: nothing to apply. Remove its spec file"):
        apply(state_db.conn_id, publisher[1]).execute({})


def test_a_disabled_subscription_is_skipped(state_db: StateDb, publisher: tuple[str, str]) -> None:
    with psycopg.connect(state_db.dsn, autocommit=True) as conn:
        assert StateStore(conn, "s1").set_enabled(False) is True
    with pytest.raises(AirflowSkipException, match=r"subscription 's1' is disabled \(ALTER SUBSCRIPTION … DISABLE"):
        apply(state_db.conn_id, publisher[1]).execute({})
