"""The "Replication" page: its data behind Airflow's login and teams, and the page itself in a real browser.

The data is asked of Airflow's own api-server app with the plugin loaded from its entry point; the
page is opened in Debian's headless Chromium on a running ``airflow api-server``, inside Airflow's UI,
at two widths, and what it draws is checked in its DOM and kept as screenshots
(``$ROWFILTER_SCREENSHOT_DIR``, else the test's temporary folder).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from airflow_provider_rowfilter.operators.replication_link import ReplicationPageLink
from airflow_provider_rowfilter.tooling.demo.dag_runner import run_dags
from tests.airflow.support import REPO, StateDb
from tests.browser import browser, chromium
from tests.e2e.airflow.page_scenario import CONFLICT_LSN, PageScenario, page_scenario
from tests.e2e.airflow.scheduler import running_airflow

# Runs in its own process: Airflow's app reads its configuration (the auth manager, the plugins) once.
SCRIPT = r"""
import json
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.models.dag import DagModel
from airflow.models.dagbundle import DagBundleModel
from airflow.models.team import Team
from airflow.utils.session import create_session

BUNDLE = "rowfilter_page_team_a"
with create_session() as session:  # the subscriptions' DAGs belong to team_a, through their bundle
    team = Team(name="team_a")
    session.add(Team(name="team_b"))
    bundle = DagBundleModel(name=BUNDLE)
    bundle.teams.append(team)
    session.add(bundle)
    session.flush()
    for dag_id in ("rowfilter_orders_incremental_sync", "rowfilter_legacy_incremental_sync"):
        session.add(DagModel(dag_id=dag_id, bundle_name=BUNDLE, fileloc="/x.py", is_paused=False))
    session.add(DagBundleModel(name=BUNDLE + "_open"))  # no team: every viewer reads it
    session.flush()
    session.add(DagModel(dag_id="rowfilter_billing_incremental_sync", bundle_name=BUNDLE + "_open", fileloc="/x.py",
                         is_paused=True))
try:
    client = TestClient(create_app())
    out = {"anonymous": client.get("/rowfilter/api/subscriptions").status_code,
           "docs": {p: client.get(p).status_code for p in ("/rowfilter/docs", "/rowfilter/redoc", "/rowfilter/openapi.json")}}
    for name, teams in (("ops_a", ["team_a"]), ("ops_b", ["team_b"])):
        token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=name, role="viewer", teams=teams))
        headers = {"Authorization": f"Bearer {token}"}
        out[name] = client.get("/rowfilter/api/subscriptions", headers=headers).json()
    out["plugins"] = client.get("/api/v2/plugins", headers=headers).json()
    out["page"] = client.get("/rowfilter/", headers=headers, follow_redirects=False).headers.get("location")
    out["bundle"] = client.get("/rowfilter/replication.js").text[:3000]
finally:
    with create_session() as session:
        session.query(DagModel).filter(DagModel.bundle_name.in_((BUNDLE, BUNDLE + "_open"))).delete()
        session.query(DagBundleModel).filter(DagBundleModel.name.in_((BUNDLE, BUNDLE + "_open"))).delete()
        session.query(Team).filter(Team.name.in_(("team_a", "team_b"))).delete()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture
def scenario(state_db: StateDb, fresh_db: Callable[..., str], tmp_path: Path) -> PageScenario:
    return page_scenario(state_db, fresh_db, tmp_path)


def test_the_data_follow_airflows_login_and_teams(airflow_db: dict[str, str], scenario: PageScenario) -> None:
    """Issue 28 items 5 and 7: a viewer of team B sees nothing of team A's subscriptions, nor the invalid
    file standing for one of them; the API docs are off. Issue 29: the JSON the page draws."""
    env = {**airflow_db, **scenario.env, "AIRFLOW__CORE__MULTI_TEAM": "True",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "ops_a:viewer:team_a,ops_b:viewer:team_b"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(line.removeprefix("RESULT "))

    assert out["anonymous"] == 401  # Airflow's own authentication guards the data
    assert out["docs"] == {"/rowfilter/docs": 404, "/rowfilter/redoc": 404, "/rowfilter/openapi.json": 404}
    # team_a's DAGs (orders, legacy) only to team_a; the others' DAGs belong to no team.
    seen_a = {v["subscription"]: v for v in out["ops_a"]}
    seen_b = {v["subscription"]: v for v in out["ops_b"]}
    assert sorted(seen_a) == ["archive", "audit", "billing", "legacy", "orders"]
    assert sorted(seen_b) == ["archive", "audit", "billing"]

    verdicts = {name: v["health"]["verdict"] for name, v in seen_a.items()}
    assert verdicts == {"orders": "ok", "billing": "paused", "audit": "broken", "legacy": "broken",
                        "archive": "dropped"}, {n: v["health"] for n, v in seen_a.items()}
    # Issue 46: a paused incremental sync is said first, with the lateness it causes; skipped batch ids explained;
    # a verify's result and a changed filter per table; the standby panel.
    billing = seen_a["billing"]
    assert billing["health"]["reasons"][0].startswith("paused: its incremental sync "
                                                      "rowfilter_billing_incremental_sync is paused"), billing["health"]
    assert any("more than 15 min" in r for r in billing["health"]["reasons"]), billing["health"]
    assert "batch ids skip" in billing["batch_ids_note"] and "No batch is missing" in billing["batch_ids_note"]
    tables = {t["table"]: t for t in seen_a["orders"]["tables"]}
    assert tables["public.t1"]["last_check"]["said"].endswith("at 0/16B3748: 2 missing"), tables["public.t1"]
    assert "at the refresh of 0/16B3400" in tables["public.t2"]["filter_changed"], tables["public.t2"]
    assert tables["sales.t3"]["filter_changed"] is None and seen_a["orders"]["batch_ids_note"] is None
    [standby] = seen_a["orders"]["standbys"]
    assert standby["role"] == "unreachable" and standby["summary"].startswith("NOT failover ready"), standby
    orders = seen_a["orders"]
    ids = [b["id"] for b in orders["batches"]]
    assert len(ids) == 10 and ids == sorted(ids, reverse=True)  # newest first
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")  # no microseconds
    assert all(stamp.match(b["finished_at"]) for b in orders["batches"]) and stamp.match(orders["measured_at"])
    assert all(t["behind_bytes"] is not None and t["last_batch_age"].endswith(" ago") for t in orders["tables"])
    assert orders["slot"]["exists"] is True and orders["chart_svg"].count("<rect") >= 36
    assert orders["dag_ids"]["skip_transaction"] == "rowfilter_orders_skip_transaction"
    assert seen_a["audit"]["conflict_lsn"] == CONFLICT_LSN
    # The repair each state calls for (plugins/repairs.py): the conflict's skip; a verify's difference and a changed
    # filter reconciled in place; the DAGs of every repair are known to the page.
    assert seen_a["audit"]["repair"] == {"kind": "skip_transaction", "values": {"lsn": CONFLICT_LSN},
                                         "label": f"Skip transaction {CONFLICT_LSN}…",
                                         "why": "a conflict stopped the apply"}
    assert orders["repair"]["kind"] == "reconcile_tables" and orders["repair"]["values"] == {
        "tables": "public.t1, public.t2", "dry_run": False}
    assert {k: orders["dag_ids"][k] for k in ("refresh", "reconcile_tables", "disable_subscription",
                                              "enable_subscription")} == {
        "refresh": "rowfilter_orders_refresh", "reconcile_tables": "rowfilter_orders_reconcile_tables",
        "disable_subscription": "rowfilter_orders_disable_subscription",
        "enable_subscription": "rowfilter_orders_enable_subscription"}
    assert seen_a["audit"]["health"]["reasons"][0].startswith('last error: conflict detected on relation "sales.t3"')
    legacy = seen_a["legacy"]
    assert "unknown key 'shedule'" in legacy["health"]["reasons"][0]
    # A typo does not hide where the subscription stands: its state, lag and slot, read through the
    # connections the broken file still names.
    assert [t["state"] for t in legacy["tables"]] == ["r", "r", "r"] and legacy["slot"]["exists"] is True
    assert legacy["last_batch"]["age_seconds"] < 600
    assert seen_a["archive"]["dropped_at"] and "dropped at" in seen_a["archive"]["health"]["reasons"][0]

    [plugin] = [p for p in out["plugins"]["plugins"] if p["name"] == "rowfilter"]
    [app] = plugin["react_apps"]
    assert (app["bundle_url"], app["url_route"], app["category"]) == ("rowfilter/replication.js", "rowfilter", "browse")
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/rowfilter"
    assert out["page"] == "../plugin/rowfilter" and "globalThis.React" in out["bundle"]


def test_the_apply_task_links_to_the_page(tmp_path: Path) -> None:
    spec = tmp_path / "s9.yaml"
    spec.write_text("subscription: s9\npublisher: postgresql://u@h/db\nsubscriber: postgresql://u@h/db\n"
                    "publications: [p1]\n")
    from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator

    op = ApplyChangesOperator(task_id="apply", spec=str(spec))
    assert [type(link) for link in op.operator_extra_links] == [ReplicationPageLink]
    assert op.operator_extra_links[0].get_link(op, ti_key=None).endswith("/plugin/rowfilter#s9")


NARROW, WIDE = 820, 1440


@pytest.mark.skipif(chromium() is None, reason="no chromium (scripts/bootstrap.sh installs it)")
def test_the_page_in_a_browser(airflow_db: dict[str, str], scenario: PageScenario, tmp_path: Path) -> None:
    """Issue 29: the page in Airflow's UI, as a person opens it during an incident, at two widths."""
    began = time.monotonic()
    shots = Path(os.environ.get("ROWFILTER_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    # The invalid file's placeholder fails a run (dag.test writes every DAG of the folder to the database too); the
    # watch DAG of audit runs its guard (nothing to guard) and its lag check, which fails: its last batch is old.
    placeholder, watch = run_dags(airflow_db, [("rowfilter_legacy_incremental_sync", None),
                                               ("rowfilter_audit_watch", None)], env=scenario.env)
    assert placeholder["state"] == "failed", placeholder["output"][-3000:]
    assert watch["tasks"] == {"guard_slot": "skipped", "check_lag": "failed"}, watch["output"][-5000:]
    with running_airflow(tmp_path, REPO / "dags", scenario.env, pieces=("api-server",), base=airflow_db) as airflow, \
            urllib.request.urlopen(f"{airflow.url}/auth/token", timeout=30) as answer:
        airflow.query("UPDATE dag SET is_paused = 1 WHERE dag_id = 'rowfilter_billing_incremental_sync'")
        token = json.load(answer)["access_token"]
        with browser(WIDE, 1000) as page:
            page.send("Network.setCookie", name="_token", value=token, url=airflow.url)
            page.open(f"{airflow.url}/plugin/rowfilter")
            page.wait_for("document.querySelectorAll('[data-testid=rowfilter-subscription]').length === 5 && "
                          "!!document.querySelector('[data-testid=rowfilter-chart]')", timeout=90, what="the page")
            cards = page.evaluate("""Array.from(document.querySelectorAll('[data-testid=rowfilter-subscription]')).map(c => ({
                id: c.id, verdict: c.dataset.verdict, text: c.innerText,
                links: Array.from(c.querySelectorAll('a')).map(a => a.getAttribute('href')),
                rects: c.querySelectorAll('svg rect').length,
                tables: Array.from(c.querySelectorAll('[data-testid=rowfilter-tables] tbody tr')).map(r =>
                    Array.from(r.cells).map(td => td.innerText)),
                batches: Array.from(c.querySelectorAll('[data-testid=rowfilter-batches] tbody tr')).map(r =>
                    Array.from(r.cells).map(td => td.innerText)),
                bold: c.querySelectorAll('[data-testid=rowfilter-last-error] b').length}))""")
            by = {c["id"].removeprefix("rowfilter-"): c for c in cards}
            assert {n: c["verdict"] for n, c in by.items()} == {
                "orders": "ok", "billing": "paused", "audit": "broken", "legacy": "broken", "archive": "dropped"}
            orders = by["orders"]
            assert orders["rects"] >= 36  # the chart: a bar per batch of the last 6 hours (and the legend's)
            assert [r[0].split("filter changed")[0].strip() for r in orders["tables"]] == [
                "public.t1", "public.t2", "sales.t3"]
            for row in orders["tables"]:  # table, state, lsn, behind now, last batch, rows copied
                assert row[1] == "r ready" and re.match(r"^[\d.,]+ (B|kB|MB|GB)$", row[3]), row
                assert re.match(r"^\d+ min \d+ s ago$", row[4]), row
            ids = [int(r[0]) for r in orders["batches"]]
            assert ids == sorted(ids, reverse=True) and len(ids) == 10
            assert all(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", r[1]) for r in orders["batches"])
            assert not re.search(r"\d\d:\d\d:\d\d\.\d", page.evaluate("document.body.innerText"))
            assert "/dags/rowfilter_orders_incremental_sync" in orders["links"]
            assert "more than 15 min" in by["billing"]["text"]
            # Issue 46: paused said first; the ids' skip explained; a failed watch check's reason; a verify's result,
            # a changed filter, the standby panel.
            assert "paused: its incremental sync rowfilter_billing_incremental_sync is paused" in by["billing"]["text"]
            assert "batch ids skip" in by["billing"]["text"] and "No batch is missing" in by["billing"]["text"]
            assert "The watch's lag check failed" in by["audit"]["text"] and "more than max_batch_age (15 min)" in \
                by["audit"]["text"], by["audit"]["text"]
            t1, t2 = orders["tables"][0], orders["tables"][1]
            assert "2 missing" in " ".join(t1) and "filter changed" in t2[0], (t1, t2)
            assert "Standbys" in orders["text"] and "unreachable" in orders["text"]
            audit = by["audit"]
            assert "<b>7</b>" in audit["text"] and audit["bold"] == 0  # an error is text, never markup
            assert f"Skip transaction {CONFLICT_LSN}" in audit["text"] and "Empty and resync sales.t3" in audit["text"]
            assert "Reconcile public.t1, public.t2 in place" in orders["text"] and "Pause (disable)" in orders["text"]
            [log] = [link for link in by["legacy"]["links"] if "/tasks/" in link]
            assert log.startswith("/dags/rowfilter_legacy_incremental_sync/runs/") and log.endswith("/tasks/invalid_spec")
            assert len(by["legacy"]["tables"]) == 3 and "unknown key 'shedule'" in by["legacy"]["text"]
            assert "dropped at" in by["archive"]["text"]
            page.screenshot(shots / "replication-wide.png", whole="[data-testid=rowfilter-page]")

            # A resync says it empties the tables, and triggers nothing until that is confirmed.
            page.evaluate("document.querySelector('#rowfilter-audit [data-testid=rowfilter-action-resync]').click()")
            page.wait_for("!!document.querySelector('[data-testid=rowfilter-trigger-dialog]')", what="the dialog")
            said = page.evaluate("document.querySelector('[data-testid=rowfilter-trigger-dialog]').innerText")
            assert "EMPTIED" in said and "Reconcile" in said, said
            assert page.evaluate("document.querySelector('[data-testid=rowfilter-trigger-submit]').disabled") is True
            page.screenshot(shots / "replication-resync-dialog.png")
            page.evaluate("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")
            page.wait_for("!document.querySelector('[data-testid=rowfilter-trigger-dialog]')", what="closed")
            # Pause, from the page: the disable DAG triggered.
            page.evaluate("document.querySelector('#rowfilter-orders [data-testid=rowfilter-action-pause]').click()")
            page.wait_for("!!document.querySelector('[data-testid=rowfilter-trigger-dialog]')", what="the dialog")
            page.evaluate("document.querySelector('[data-testid=rowfilter-trigger-submit]').click()")
            page.wait_for("document.querySelector('[data-testid=rowfilter-trigger-dialog]').innerText"
                          ".includes('Triggered:')", what="the triggered pause")
            assert airflow.query("SELECT count(*) FROM dag_run WHERE dag_id = 'rowfilter_orders_disable_subscription'"
                                 ) == [(1,)]
            page.evaluate("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")
            page.wait_for("!document.querySelector('[data-testid=rowfilter-trigger-dialog]')", what="closed")

            # The repair offered first: the skip DAG's trigger form, its LSN filled in from the conflict; triggered
            # as the signed-in user.
            page.evaluate("document.querySelector('#rowfilter-audit [data-testid=rowfilter-action-repair]').click()")
            page.wait_for("!!document.querySelector('[data-testid=rowfilter-trigger-dialog]')", what="the dialog")
            assert page.evaluate("document.querySelector('[data-testid=rowfilter-param-lsn]').value") == CONFLICT_LSN
            page.screenshot(shots / "replication-skip-dialog.png")
            page.evaluate("document.querySelector('[data-testid=rowfilter-trigger-submit]').click()")
            page.wait_for("document.querySelector('[data-testid=rowfilter-trigger-dialog]').innerText"
                          ".includes('Triggered:')", what="the triggered run")
            [conf] = airflow.query("SELECT conf FROM dag_run WHERE dag_id = 'rowfilter_audit_skip_transaction'")
            assert json.loads(conf[0]) == {"lsn": CONFLICT_LSN}
            page.evaluate("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")

            # Read again without reloading: a new batch shows up, the page is the same document.
            page.evaluate("window.rowfilterMarker = 42")
            newest = scenario.add_batch("orders", 4321)
            page.wait_for(f"document.querySelector('#rowfilter-orders [data-testid=rowfilter-batches] tbody td')"
                          f".innerText === '{newest}'", timeout=40, what="the new batch")
            assert page.evaluate("window.rowfilterMarker") == 42

            page.size(NARROW, 1000)
            page.wait_for(f"window.innerWidth === {NARROW}")
            time.sleep(0.5)
            overflow = page.evaluate("""Array.from(document.querySelectorAll('[data-testid=rowfilter-subscription]'))
                .map(c => c.getBoundingClientRect().right).filter(r => r > window.innerWidth + 1).length""")
            assert overflow == 0  # the cards fit; wide tables scroll inside their own box
            assert page.evaluate("document.querySelectorAll('[data-testid=rowfilter-verdict]').length") == 5
            page.screenshot(shots / "replication-narrow.png", whole="[data-testid=rowfilter-page]")

            # Airflow's dark mode: the page has the UI's theme, its colours too.
            page.evaluate("localStorage.setItem('theme', 'dark'); window.location.hash = 'orders'")
            page.size(WIDE, 1000)
            page.send("Page.reload")  # the UI reads its colour mode when it loads
            page.wait_for("document.documentElement.classList.contains('dark') && "
                          "!!document.querySelector('#rowfilter-orders [data-testid=rowfilter-chart]')", what="dark")
            assert page.evaluate("getComputedStyle(document.querySelector('#rowfilter-orders')).backgroundColor") != \
                "rgb(255, 255, 255)"
            page.screenshot(shots / "replication-dark.png")
    with psycopg.connect(scenario.sub) as conn:
        assert conn.execute("SELECT count(*) FROM rowfilter.batch_history WHERE subscription = 'orders'").fetchone()[0] == 37
    print(f"browser test: {time.monotonic() - began:.1f} s; screenshots in {shots}")
