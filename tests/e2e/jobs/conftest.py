"""Fixtures of the job tests: a publisher, our subscriber and a native subscriber, side by side."""

from __future__ import annotations

import pytest

from tests.e2e.jobs.apply_scenario import PUBLICATIONS, PUBLISHER, SUBSCRIBER, Job
from tests.e2e.jobs.databases import Databases, run_ours
from tests.e2e.jobs.snapshot_scenario import make_setup
from tests.roles import ROLES, PasswordRole

#: The fixture of fresh databases on each PostgreSQL major version (tests/conftest.py).
FRESH_DB = {18: "fresh_db", 17: "fresh_db17", 16: "fresh_db16"}


@pytest.fixture
def pg_version():
    """The PostgreSQL major version of the ``dbs`` databases: 18 (the run's cluster) unless a test parametrizes it
    (17 or 16: their clusters of tests/conftest.py), so that a differential case runs on a 17 publisher beside a 17
    native subscriber, ours on 17 too, at no cost but the cluster's start."""
    return 18


@pytest.fixture
def dbs(request, tmp_path, pg_version):
    """Three fresh databases (publisher, ours, native) of PostgreSQL ``pg_version`` and a change-log folder per
    subscription of ours; the native subscriptions made through it are dropped afterwards. Modules may define their
    own ``dbs``."""
    fresh_db = request.getfixturevalue(FRESH_DB[pg_version])
    databases = Databases(fresh_db(), fresh_db(), fresh_db(), change_logs=tmp_path)
    yield databases
    for native in databases.natives:
        native.drop()


@pytest.fixture
def filtering():
    """Who evaluates the publications (core/spec/subscription.py): ``auto`` (source here); a test parametrizes it for both."""
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
    """The snapshot scenario (tests/e2e/jobs/snapshot_scenario.py): spec and spec file of a fresh subscription."""
    return make_setup(fresh_db, tmp_path)


@pytest.fixture
def cluster_roles(request, pg_version) -> dict[str, PasswordRole]:
    """:func:`tests.conftest.password_roles`, made on the cluster of ``pg_version`` too (the roles' passwords are the
    run's: the cluster of each version gets the same two roles)."""
    if pg_version == 18:
        return request.getfixturevalue("password_roles")
    pg = request.getfixturevalue({17: "local_pg17", 16: "local_pg16"}[pg_version])
    for role in ROLES.values():
        pg.create_role(role.name, role.password, superuser=True, replication=True)
    return ROLES
