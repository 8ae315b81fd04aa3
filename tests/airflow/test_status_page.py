"""The "Replication" page, served by Airflow's own api-server app with the plugin loaded from its entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.airflow.conftest import REPO, StateDb, conn_env

# Runs in its own process: Airflow's app reads its configuration (the auth manager, the plugins) once.
SCRIPT = r"""
import json
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

client = TestClient(create_app())
out = {"anonymous": client.get("/rowfilter/").status_code}
token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ops", role="viewer"))
headers = {"Authorization": f"Bearer {token}"}
page = client.get("/rowfilter/", headers=headers)
out.update(status=page.status_code, page=page.text,
           api=client.get("/rowfilter/api/subscriptions", headers=headers).json(),
           plugins=client.get("/api/v2/plugins", headers=headers).json())
print("RESULT " + json.dumps(out))
"""


def test_the_page_shows_states_errors_batches_and_the_slot_to_signed_in_users(
        airflow_db: dict[str, str], state_db: StateDb, fresh_db: Callable[..., str], tmp_path: Path) -> None:
    pub = fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('rowfilter_s1', 'pgoutput')")
    try:
        state_db.set_states(**{"public.t1": "r", "public.t2": "f"})
        state_db.record_error("sales.t3", "<b>duplicate key value violates unique constraint \"t3_pkey\"</b>")
        with psycopg.connect(state_db.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO rowfilter.batch_history (subscription, end_lsn, changes, transactions, "
                         "lag_seconds, duration_ms) VALUES ('s1', '0/16B3748', 1234, 56, 0.8, 2500)")
        folder = tmp_path / "subscriptions"
        folder.mkdir()
        (folder / "s1.yaml").write_text("subscription: s1\npublisher_conn_id: rf_page_pub\n"
                                        "subscriber_conn_id: rf_page_sub\npublications: [p1]\n")
        (folder / "broken.yaml").write_text("subscription: broken\npublications: [p1]\ntypo_key: 1\n")
        env = {**airflow_db, "ROWFILTER_SUBSCRIPTIONS_DIR": str(folder),
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ops:viewer",
               conn_env("rf_page_pub"): pub, conn_env("rf_page_sub"): state_db.dsn}
        done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=300, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
        out = json.loads(line.removeprefix("RESULT "))
    finally:
        with psycopg.connect(pub, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('rowfilter_s1')")

    assert out["anonymous"] == 401  # Airflow's own authentication guards the page
    assert out["status"] == 200
    page = out["page"]
    assert "<h2>s1</h2>" in page and "rowfilter_s1_incremental_sync" in page
    assert "<td>public.t1</td><td>r ready</td>" in page and "<td>public.t2</td><td>f finished copy</td>" in page
    # An error is shown as text, never as markup.
    assert "&lt;b&gt;duplicate key value violates unique constraint &quot;t3_pkey&quot;&lt;/b&gt;" in page
    assert "<b>duplicate" not in page
    assert "<td>1,234</td><td>56</td><td>800 ms</td><td>2.5 s</td>" in page
    assert "slot <code>rowfilter_s1</code>: reserved, retains" in page
    assert "invalid spec file" in page and "typo_key" in page  # the broken file is named, the others still shown

    [s1] = [v for v in out["api"] if v["subscription"] == "s1"]
    assert {t["table"]: t["state"] for t in s1["tables"]} == {"public.t1": "r", "public.t2": "f", "sales.t3": "i"}
    assert s1["slot"]["exists"] is True and s1["batches"][0]["changes"] == 1234
    [plugin] = [p for p in out["plugins"]["plugins"] if p["name"] == "rowfilter"]
    assert plugin["external_views"][0]["href"] == "/rowfilter/"
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/rowfilter"
