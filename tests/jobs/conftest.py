"""Fixtures of the job tests: a publisher, our subscriber and a native subscriber, side by side."""

from __future__ import annotations

import pytest

from tests.jobs.apply_scenario import PUBLICATIONS, PUBLISHER, SUBSCRIBER, Job
from tests.jobs.databases import Databases, run_ours
from tests.jobs.snapshot_scenario import make_setup


@pytest.fixture
def dbs(fresh_db, tmp_path):
    """Three fresh databases (publisher, ours, native) and a change-log folder per subscription of ours;
    the native subscriptions made through it are dropped afterwards. Modules may define their own ``dbs``."""
    databases = Databases(fresh_db(), fresh_db(), fresh_db(), change_logs=tmp_path)
    yield databases
    for native in databases.natives:
        native.drop()


@pytest.fixture
def filtering():
    """Who evaluates the publications (core/spec.py): ``auto`` (source here); a test parametrizes it for both."""
    return "auto"


@pytest.fixture
def job(dbs, spark, tmp_path, filtering):
    """The apply scenario: refresh and initial copy done in this process, a native subscription beside it."""
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    ours = Job(dbs, tmp_path, filtering)
    run_ours(ours.spec, spark)  # refresh + initial copy, in this process
    ours.initial_slot = ours.slot_position()
    ours.native = native
    return ours


@pytest.fixture
def setup(fresh_db, tmp_path):
    """The snapshot scenario (tests/jobs/snapshot_scenario.py): spec and spec file of a fresh subscription."""
    return make_setup(fresh_db, tmp_path)
