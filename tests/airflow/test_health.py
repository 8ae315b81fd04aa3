"""The Replication page's verdicts (plugins/health.py), pure: at risk, paused, lagging, in that order (issue 46)."""

from __future__ import annotations

import datetime as dt

from airflow_provider_rowfilter.plugins.health import Facts, judge
from airflow_provider_rowfilter.plugins.replication_view import RunFacts

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.timezone.utc)
IDLE = {"setting": "idle_replication_slot_timeout", "reason": "idle_timeout", "seconds_left": 1200.0,
        "at_risk": False, "said": "invalidated (idle_timeout) in about 20 min: not read for 40 min …"}
LIVE = {"past_copy": ["public.t"], "schedule_interval": 300.0}


def test_at_risk_comes_before_paused_and_lagging_and_says_the_time_left():
    health = judge(Facts(**LIVE, batch_age=3600.0, paused_dag="s1_inc", exposures=[{**IDLE, "at_risk": True}]))
    assert health.verdict == "at_risk"
    assert health.reasons[0] == f"its slot would be {IDLE['said']}" and "paused: its incremental sync s1_inc" in \
        health.reasons[1]


def test_a_paused_dag_is_paused_not_lagging_and_says_the_slot_clock():
    health = judge(Facts(**LIVE, batch_age=3600.0, paused_dag="s1_inc", exposures=[IDLE]))
    assert health.verdict == "paused"
    assert health.reasons[0].startswith("paused: its incremental sync s1_inc is paused")
    assert health.reasons[1] == f"its slot would be {IDLE['said']}"
    assert any("more than 15 min" in r for r in health.reasons), health.reasons  # the lateness it causes
    assert judge(Facts(**LIVE, batch_age=60.0)).verdict == "ok"


def test_a_disabled_subscription_is_not_late_and_a_failed_check_or_an_overdue_run_lags():
    assert judge(Facts(**LIVE, batch_age=3600.0, enabled=False)).verdict == "disabled"
    health = judge(Facts(**LIVE, batch_age=60.0, check_failed=["its slot has not been read for 31 min"]))
    assert (health.verdict, health.reasons) == ("lagging", ["the watch's lag check failed: its slot has not been read "
                                                            "for 31 min"])
    facts = RunFacts(running_since=NOW - dt.timedelta(minutes=12), running_run="scheduled__x")
    said = facts.overdue(300.0, NOW)
    assert said.startswith("run scheduled__x has been running for 12 min") and "interval (5 min)" in said
    assert facts.overdue(3600.0, NOW) is None and RunFacts().overdue(300.0, NOW) is None
    assert judge(Facts(**LIVE, batch_age=60.0, overdue_run=said)).verdict == "lagging"


# --- the repair offered first (plugins/repairs.py) ------------------------------------------------------------
def _view(**fields):
    from airflow_provider_rowfilter.plugins.replication_view import SubscriptionView

    dag_ids = {k: f"rowfilter_s1_{k}" for k in ("refresh", "skip_transaction", "reconcile_tables", "resync_tables")}
    tables = fields.pop("tables", [{"table": "public.t", "state": "r", "last_error": None}])
    return SubscriptionView("s1", "/s1.yaml", dag_ids, ["p"], tables=tables, **fields)


def test_a_lost_slot_offers_recreate_and_reconcile_never_a_resync():
    from airflow_provider_rowfilter.plugins.repairs import offered_repair

    for slot in ({"exists": False}, {"exists": True, "wal_status": "lost"}):
        repair = offered_repair(_view(slot=slot, conflict_lsn="0/1A"))
        assert repair["kind"] == "refresh" and repair["values"] == {"recreate_slot": True, "reconcile": True}, slot
    # The slot's error names the repair while the publisher could not be read.
    hinted = _view(last_error="replication slot rowfilter_s1 does not exist; HINT: run `rowfilter refresh "
                              "--recreate-slot --reconcile`")
    assert offered_repair(hinted)["kind"] == "refresh"
    assert offered_repair(_view(slot={"exists": False}, tables=[{"table": "public.t", "state": "i"}])) is None


def test_a_conflict_offers_the_skip_and_a_changed_filter_the_reconcile():
    from airflow_provider_rowfilter.plugins.repairs import offered_repair

    assert offered_repair(_view(slot={"exists": True}, conflict_lsn="0/1A"))["values"] == {"lsn": "0/1A"}
    changed = _view(slot={"exists": True}, tables=[
        {"table": "public.a", "state": "r", "filter_changed": "its filter changed"},
        {"table": "public.b", "state": "r", "last_check": {"kind": "verify", "clean": False}},
        {"table": "public.c", "state": "r", "last_check": {"kind": "verify", "clean": True}}])
    repair = offered_repair(changed)
    assert repair["kind"] == "reconcile_tables" and repair["values"]["tables"] == "public.a, public.b"
    assert offered_repair(_view(slot={"exists": True})) is None
