"""The spec's change_log key: resolved relative to the spec file, defaulted per subscription."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.spec_paths import ALLOWED_PATHS_ENV


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
def test_given_path_is_resolved_relative_to_the_spec_file(tmp_path, monkeypatch, value, expected):
    # Outside the spec file's folder: allowed by whoever runs the jobs (core/spec_paths.py), never by the spec.
    monkeypatch.setenv(ALLOWED_PATHS_ENV, f"/nowhere{os.pathsep}{tmp_path}")
    spec = SubscriptionSpec.load(write(tmp_path, f"change_log: {value.format(tmp=tmp_path)}\n"))
    assert spec.change_log == str(tmp_path / expected)


@pytest.mark.parametrize("value", ["../logs/s1", "/{tmp}/abs", "link/changes"], ids=["up", "absolute", "symlink"])
def test_a_path_outside_the_spec_file_s_folder_is_refused(tmp_path, monkeypatch, value):
    """Issue 28, item 3: a spec file's paths stay in its folder, symlinks resolved, unless the environment allows more."""
    monkeypatch.delenv(ALLOWED_PATHS_ENV, raising=False)
    path = write(tmp_path, f"change_log: {value.format(tmp=tmp_path)}\n")
    (path.parent / "link").symlink_to(tmp_path)
    with pytest.raises(SpecError, match=rf"change_log '{re.escape(value.format(tmp=tmp_path))}' is outside the spec "
                       rf"file's folder '{re.escape(str(path.parent))}'.*\n.*{ALLOWED_PATHS_ENV}="):
        SubscriptionSpec.load(path)


@pytest.mark.parametrize("value", ["/", "/etc", "/usr", "/var", "/bin", "/proc", "/sys", "/dev", "/etc/rowfilter", "~"],
                         ids=lambda v: v)
def test_a_system_directory_is_refused_allowed_or_not(tmp_path, monkeypatch, value):
    """Issue 28, item 6: never a system directory (the writer makes, renames and removes files there)."""
    monkeypatch.setenv(ALLOWED_PATHS_ENV, "/")
    value = os.path.expanduser(value)
    with pytest.raises(SpecError, match=r"change_log .* is (a system directory|the home directory|inside the system "
                       r"directory /etc)\nHINT:  give the change log a directory of its own"):
        SubscriptionSpec.load(write(tmp_path, f"change_log: {value}\n"))
    with pytest.raises(SpecError, match="subscription 's1': change_log"):
        SubscriptionSpec(subscription="s1", publications=("p1",), change_log=value)  # the JSON's spec too


def test_survives_the_json_boundary(tmp_path):
    spec = SubscriptionSpec.load(write(tmp_path))
    assert SubscriptionSpec.from_json(spec.to_json()).change_log == spec.change_log


def test_without_a_file_the_default_is_under_the_working_directory():
    spec = SubscriptionSpec(subscription="s2", publications=("p1",))
    assert spec.change_log is None and spec.change_log_dir() == Path(".rowfilter/s2/changes")


def test_not_a_path_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"change_log=\[1\] is not a directory path"):
        SubscriptionSpec.load(write(tmp_path, "change_log: [1]\n"))
