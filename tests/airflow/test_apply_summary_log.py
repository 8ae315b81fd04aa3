"""The apply task's summary in its log (issue 18, item 10): durations and lags as a person reads them,
never ``None``; a table whose changes were all skipped says so instead of "nothing".

The summary is read from a real subscriber's ``rowfilter.batch_history`` (tests/status_scenario.py),
as the operator reads it after its job.
"""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.hooks.rowfilter import ResolvedSpec
from airflow_provider_rowfilter.operators.apply_changes import ApplyChangesOperator
from tests.status_scenario import LONG, status_scenario


def test_the_summary_reads_as_a_person_reads(fresh_db, tmp_path, capsys: pytest.CaptureFixture) -> None:
    path, lsn = status_scenario(fresh_db, tmp_path)
    op = ApplyChangesOperator(task_id="apply", spec=path)
    capsys.readouterr()
    result = op.summary(ResolvedSpec(SubscriptionSpec.load(path)), 0)
    assert result["counts"][f"public.{LONG}"] == {"insert": 3, "skipped": 2} and result["lag_seconds"] == 11.852699
    text = capsys.readouterr().out  # the task logger (structlog) writes to stdout under pytest
    assert f"public.{LONG}: insert 3, skipped 2" in text, text
    assert "in 11.9 s" in text and "lag when captured: 0 B, 11.9 s" in text, text
    assert "None" not in text and "11.852699" not in text and "nothing" not in text, text
