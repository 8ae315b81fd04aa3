"""The spec's change_log key: resolved relative to the spec file, defaulted per subscription."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec import SubscriptionSpec


def write(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "specs" / "s1.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text("subscription: s1\npublications: [p1]\n" + extra)
    return path


def test_default_is_beside_the_spec_file(tmp_path):
    spec = SubscriptionSpec.load(write(tmp_path))
    assert spec.change_log == str(tmp_path / "specs" / ".rowfilter" / "s1" / "changes")
    assert spec.change_log_dir() == tmp_path / "specs" / ".rowfilter" / "s1" / "changes"


@pytest.mark.parametrize(("value", "expected"), [
    ("../logs/s1", "logs/s1"), ("/{tmp}/abs", "abs"),
], ids=["relative-to-the-spec-file", "absolute"])
def test_given_path_is_resolved_relative_to_the_spec_file(tmp_path, value, expected):
    spec = SubscriptionSpec.load(write(tmp_path, f"change_log: {value.format(tmp=tmp_path)}\n"))
    assert spec.change_log == str(tmp_path / expected)


def test_survives_the_json_boundary(tmp_path):
    spec = SubscriptionSpec.load(write(tmp_path))
    assert SubscriptionSpec.from_json(spec.to_json()).change_log == spec.change_log


def test_without_a_file_the_default_is_under_the_working_directory():
    spec = SubscriptionSpec(subscription="s2", publications=("p1",))
    assert spec.change_log is None and spec.change_log_dir() == Path(".rowfilter/s2/changes")


def test_not_a_path_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"change_log=\[1\] is not a directory path"):
        SubscriptionSpec.load(write(tmp_path, "change_log: [1]\n"))
