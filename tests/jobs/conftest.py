"""Fixtures of the job tests: a publisher, our subscriber and a native subscriber, side by side."""

from __future__ import annotations

import pytest

from tests.jobs.test_snapshot_differential import Databases


@pytest.fixture
def dbs(fresh_db, tmp_path):
    """Three fresh databases (publisher, ours, native) and a change-log folder per subscription of ours;
    the native subscriptions made through it are dropped afterwards. Modules may define their own ``dbs``."""
    databases = Databases(fresh_db(), fresh_db(), fresh_db(), change_logs=tmp_path)
    yield databases
    for native in databases.natives:
        native.drop()
