"""Subscriptions for the Replication page, one of each kind: ok, lagging, broken by a conflict, an invalid spec
file, dropped. Made through the state store on a real subscriber and real slots on a real publisher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from airflow_provider_rowfilter.subscriber.state import StateStore
from tests.airflow.support import StateDb, conn_env

#: The conflict the broken subscription records: markup in it must be shown as text.
CONFLICT_LSN = "0/1A2B3C8"
CONFLICT = ('conflict detected on relation "sales.t3": conflict=insert_exists\n'
            "DETAIL:  Key (g)=(<b>7</b>) already exists in the subscriber; remote transaction 812 finished at "
            f"{CONFLICT_LSN}. Nothing of the batch was applied.\n"
            f"HINT:  remove or change the subscriber's row and run again; or skip the whole remote transaction with "
            f"`rowfilter skip --lsn {CONFLICT_LSN}` (ALTER SUBSCRIPTION … SKIP); or set conflict_policy: upsert")
SUBSCRIPTIONS = ("orders", "billing", "audit", "archive")
SPEC = "subscription: {name}\npublisher_conn_id: rf_page_pub\nsubscriber_conn_id: rf_page_sub\npublications: [p1]\n"
#: orders names a standby that does not answer: the page's standby panel says so.
STANDBY = "standbys: ['postgresql://postgres@127.0.0.1:1/pub?connect_timeout=2']\n"


@dataclass
class PageScenario:
    folder: Path
    env: dict[str, str]
    sub: str
    pub: str

    def add_batch(self, subscription: str, changes: int) -> int:
        with psycopg.connect(self.sub, autocommit=True) as conn:
            return conn.execute(
                "INSERT INTO rowfilter.batch_history (subscription, start_lsn, end_lsn, changes, transactions, "
                "lag_seconds, duration_ms, counts) VALUES (%s, '0/16B3700', '0/16B3748', %s, 3, 0.4, 900, '{}') "
                "RETURNING id", (subscription, changes)).fetchone()[0]


def page_scenario(state_db: StateDb, fresh_db: Callable[..., str], tmp_path: Path) -> PageScenario:
    pub = fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        for name in ("orders", "billing", "audit", "legacy"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"rowfilter_{name}",))
    dbs = {name: state_db.another(name) for name in (*SUBSCRIPTIONS, "legacy")}
    for name in ("orders", "billing", "audit", "legacy"):
        dbs[name].set_states(**{"public.t1": "r", "public.t2": "r", "sales.t3": "r"})
    with psycopg.connect(state_db.dsn, autocommit=True) as conn:
        # orders: a batch every 10 minutes for the last 6 hours, the newest 2 minutes ago.
        conn.execute("""
            INSERT INTO rowfilter.batch_history (subscription, start_lsn, end_lsn, changes, transactions, lag_seconds,
                                                 duration_ms, counts, finished_at)
            SELECT 'orders', '0/16B3700', '0/16B3748', 200 + (n * 137) % 900, 5 + n % 7,
                   CASE WHEN n % 9 = 4 THEN NULL ELSE 0.3 + (n * 53 % 40) / 10.0 END, 700 + n * 13, '{}',
                   now() - make_interval(mins => 2 + 10 * n)
            FROM generate_series(35, 0, -1) AS n""")
        # billing: its last batch 45 minutes ago, with the default schedule of every 5 minutes.
        conn.execute("""
            INSERT INTO rowfilter.batch_history (subscription, start_lsn, end_lsn, changes, transactions, lag_seconds,
                                                 duration_ms, counts, finished_at)
            SELECT 'billing', '0/16B3700', '0/16B3748', 40, 2, 1.5, 800, '{}', now() - make_interval(mins => 45 + 5 * n)
            FROM generate_series(5, 0, -1) AS n""")
        conn.execute("""
            INSERT INTO rowfilter.batch_history (subscription, start_lsn, end_lsn, changes, transactions, lag_seconds,
                                                 duration_ms, counts, finished_at)
            VALUES ('audit', '0/16B3700', '0/16B3748', 12, 1, 0.9, 650, '{}', now() - interval '20 minutes'),
                   ('legacy', '0/16B3700', '0/16B3748', 30, 2, 0.5, 700, '{}', now() - interval '4 minutes')""")
    with psycopg.connect(state_db.dsn, autocommit=True) as conn:
        # billing: one more batch after the others' took ids: its ids skip, and the page says why (issue 46).
        conn.execute("""
            INSERT INTO rowfilter.batch_history (subscription, start_lsn, end_lsn, changes, transactions, lag_seconds,
                                                 duration_ms, counts, finished_at)
            VALUES ('billing', '0/16B3748', '0/16B3790', 40, 2, 1.5, 800, '{}', now() - interval '44 minutes')""")
        # orders: a verify that found rows missing in public.t1; a refresh that changed public.t2's copy filter.
        conn.execute("""
            INSERT INTO rowfilter.table_check (subscription, schema_name, table_name, kind, lsn, clean, result)
            VALUES ('orders', 'public', 't1', 'verify', '0/16B3748', false, '{"missing": 2, "rows": 40}')""")
        conn.execute("""
            INSERT INTO rowfilter.refresh_history (subscription, lsn, added, removed, definitions)
            VALUES ('orders', '0/16B3000', '{}', '{}', '{"tables": [{"table": "public.t2", "copy_filter": "(b > 1)"}]}'),
                   ('orders', '0/16B3400', '{}', '{}', '{"tables": [{"table": "public.t2", "copy_filter": "(b > 5)"}]}')""")
    with psycopg.connect(state_db.dsn, autocommit=True) as conn:  # where the last batches ended (record_batch's)
        conn.execute("UPDATE rowfilter.subscription SET applied_lsn = '0/16B3748' WHERE name <> 's1'")
    dbs["audit"].record_error(None, CONFLICT)
    dbs["audit"].record_error("sales.t3", CONFLICT)
    with psycopg.connect(state_db.dsn) as conn:
        with conn.transaction():
            StateStore(conn, "archive").drop()
    folder = tmp_path / "subscriptions"
    folder.mkdir()
    for name in SUBSCRIPTIONS:
        (folder / f"{name}.yaml").write_text(SPEC.format(name=name) + (STANDBY if name == "orders" else ""))
    (folder / "legacy.yaml").write_text(SPEC.format(name="legacy") + "airflow:\n  shedule: '@hourly'\n")
    env = {"ROWFILTER_SUBSCRIPTIONS_DIR": str(folder), conn_env("rf_page_pub"): pub, conn_env("rf_page_sub"): state_db.dsn}
    return PageScenario(folder, env, state_db.dsn, pub)
