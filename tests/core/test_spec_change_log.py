"""The spec's change_log key: resolved relative to the spec file, defaulted per subscription."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.paths import ALLOWED_PATHS_ENV
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec


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
    # Outside the spec file's folder: allowed by whoever runs the jobs (core/spec/paths.py), never by the spec.
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


@pytest.mark.parametrize("value", ["s3a://bucket/s1", "S3N://bucket/s1", "https://example.com/s1", "ftp://h/s1",
                                   "c:/logs"], ids=lambda v: v)
def test_a_url_of_a_scheme_not_served_is_refused_never_a_local_path(tmp_path, monkeypatch, value):
    """Issue 32: ``s3://bucket/subs/s1`` became a local directory ``s3:`` under the working directory, the bucket
    stayed empty. A value that starts like a URL is a URL: served, or refused at spec load; nothing is created."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, f"change_log: {value}\n")
    scheme = value.split(":")[0].lower()
    hint = "write it as s3://" if scheme in ("s3a", "s3n") else "use a directory every capture and apply reaches"
    with pytest.raises(SpecError, match=rf"change_log '{re.escape(value)}': the URL scheme {re.escape(scheme)}:// is "
                       rf"not served by this release; it is never taken as a local path\nHINT:  {hint}"):
        SubscriptionSpec.load(path)
    with pytest.raises(SpecError, match=rf"subscription 's1': change_log '{re.escape(value)}'"):
        SubscriptionSpec(subscription="s1", publications=("p1",), change_log=value)  # the JSON's spec too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specs"]  # no "s3:" directory anywhere
    assert sorted(p.name for p in path.parent.iterdir()) == ["s1.yaml"]


@pytest.mark.parametrize("value", ["s3://bucket/subs/s1", "gs://bucket/s1", "abfs://c@acct.dfs.core.windows.net/s1",
                                   "hdfs://nn:8020/logs/s1"], ids=lambda v: v.split(":")[0])
def test_an_object_store_url_is_kept_as_a_url(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    spec = SubscriptionSpec.load(write(tmp_path, f"change_log: {value}\n"))
    assert spec.change_log == value and not spec.change_log_location().local
    assert SubscriptionSpec.from_json(spec.to_json()).change_log == value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specs"]


def test_an_object_store_url_without_a_bucket_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"change_log 's3:/bucket/s1' names no bucket\nHINT:  write s3://bucket/"):
        SubscriptionSpec.load(write(tmp_path, "change_log: s3:/bucket/s1\n"))


def test_a_file_url_is_the_local_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(ALLOWED_PATHS_ENV, str(tmp_path))
    spec = SubscriptionSpec.load(write(tmp_path, f"change_log: file://{tmp_path}/logs/s1\n"))
    assert spec.change_log == str(tmp_path / "logs" / "s1")
    given = SubscriptionSpec(subscription="s1", publications=("p1",), change_log=f"file://localhost{tmp_path}/x")
    assert given.change_log_dir() == tmp_path / "x"
    with pytest.raises(SpecError, match=r"change_log 'file://otherhost/x' is not a local file URL"):
        SubscriptionSpec(subscription="s1", publications=("p1",), change_log="file://otherhost/x")


def test_change_log_conn_id_is_an_airflow_connection_id_for_a_log_on_object_storage() -> None:
    """``change_log_conn_id`` names the Airflow connection of the store's credentials: taken with a URL, refused with a
    local directory (which takes no credentials) and when it is not a connection id."""
    spec = SubscriptionSpec(subscription="s1", publications=("p",), change_log="s3://b/s1", change_log_conn_id="aws_s3")
    assert SubscriptionSpec.from_json(spec.to_json()).change_log_conn_id == "aws_s3"
    with pytest.raises(SpecError, match="names change_log_conn_id 'aws_s3', but its change log '/data/s1' is a local"):
        SubscriptionSpec(subscription="s1", publications=("p",), change_log="/data/s1", change_log_conn_id="aws_s3")
    with pytest.raises(SpecError, match="change_log_conn_id 'aws s3' of subscription 's1' is not an Airflow connection id"):
        SubscriptionSpec(subscription="s1", publications=("p",), change_log="s3://b/s1", change_log_conn_id="aws s3")
