"""The apply with its change log on object storage (issue 32): the run's S3-compatible server on 127.0.0.1.

A cheap subset of the directory's tests, with the log in a bucket and every job given the store's
credentials through the standard environment (tests/s3_server.py), never a command line:

- killed at the capture's two fault points and after the subscriber's commit, then rerun: the subscriber
  matches the native one (a differential check per point);
- a backlog drained by one run in several batches (judged by the publisher, reduced in process), and the
  differential test's step-by-step example in both capture modes: in ``spark`` mode Spark reads the bucket's
  segments (here a ``local`` session without hadoop-aws: its Python workers read them with pyarrow,
  spark/log_reader.py).

The directory's own tests (test_apply_faults.py, test_apply_drain.py, test_apply_differential.py) cover
every other point and case; what differs on a store is only change_log/store.py.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from airflow_provider_rowfilter.change_log.segment_reader import segment_filtering
from airflow_provider_rowfilter.change_log.store import open_change_log
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.apply.drain import apply
from tests.e2e.jobs.apply_scenario import (
    PUBLICATIONS,
    PUBLISHER,
    SUBSCRIBER,
    TABLES,
    Job,
    assert_same_as_native,
    bulk,
    changes,
    publish,
    write_spec,
)
from tests.e2e.jobs.databases import FILTERING_MODES, names, run_ours
from tests.e2e.jobs.differential_cases import DOC_PUBLISHER, DOC_STEPS, DOC_TABLES
from tests.e2e.jobs.drain_scenario import BATCH, backlog
from tests.e2e.jobs.drain_scenario import PUBLISHER as DRAIN_PUBLISHER


@pytest.fixture
def s3_job(dbs, spark, s3_log):
    dbs.create(PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    ours = Job(dbs, dbs.change_logs, "source", change_log=s3_log)
    run_ours(ours.spec, spark)
    ours.initial_slot = ours.slot_position()
    ours.native = native
    return ours


def objects(s3, url: str) -> list[str]:
    bucket, prefix = url[len("s3://"):].split("/", 1)
    return [k[len(prefix) + 1:] for k in s3.keys(bucket, prefix + "/")]


# The capture's two points (where the store changes what "durable" means) and the commit (the store's pruning);
# the apply's other points do nothing different on a store (tests/e2e/jobs/test_apply_faults.py runs them all).
@pytest.mark.parametrize("point", ["capture-mid-read", "capture-after-segment", "apply-after-commit"])
def test_killed_at_a_fault_point_with_the_log_on_s3_then_rerun_matches_native(s3, s3_job, s3_log, point):
    job = s3_job
    began = time.monotonic()
    publish(job.dbs.publisher, changes(0) + ([bulk(0)] if point == "capture-mid-read" else []))
    before_tables, before_positions = job.ours(), job.positions()
    killed = job.run(fault=point)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-4000:])
    log = open_change_log(job.spec)
    if point == "capture-mid-read":
        # A row group written to the private local file; nothing in the bucket, the slot where it was.
        assert not log.segments() and not [o for o in objects(s3, s3_log) if o.endswith(".parquet")]
        assert job.slot_position() == job.initial_slot
    elif point == "capture-after-segment":
        assert len(log.segments()) == 1 and job.slot_position() < log.captured_through()
    if point != "apply-after-commit":
        assert (job.ours(), job.positions()) == (before_tables, before_positions)
    publish(job.dbs.publisher, changes(1))
    rerun = job.summary(job.run())
    if point == "capture-after-segment":
        assert rerun["capture"]["recovered_lsn"] is not None, rerun["capture"]
    assert_same_as_native(job)
    assert all(state == "r" for _, _, state, _ in job.positions())
    assert job.staged_rows() == 0
    print(f"{point} on S3: {time.monotonic() - began:.1f} s")


def test_a_backlog_is_drained_by_one_run_with_the_log_on_s3(dbs, spark, s3, s3_log):
    began = time.monotonic()
    dbs.create(DRAIN_PUBLISHER, SUBSCRIBER)
    native = dbs.subscribe_native(PUBLICATIONS)
    # Judged by the publisher (filtering: source), so the batches are reduced in this process (cheap); Spark reads
    # the bucket's segments in the differential example's spark mode below.
    _, spec = write_spec(dbs, dbs.change_logs, filtering="source", change_log=s3_log)
    run_ours(spec, spark)
    publish(dbs.publisher, backlog(24))
    result = apply(spec, max_changes=BATCH, spark=spark)
    native.wait_caught_up()
    dbs.assert_same(TABLES)
    assert result.drained and result.batches >= 3 and result.transactions >= 18, result.summary()
    # Pruned as in a directory: the newest segment stays, it records where the log ends.
    assert [o for o in objects(s3, s3_log) if o.endswith(".parquet")] == [open_change_log(spec).segments()[-1].path.name]
    print(f"drain on S3: {time.monotonic() - began:.1f} s")


@pytest.mark.parametrize("filtering", FILTERING_MODES)
def test_update_transformation_example_step_by_step_with_the_log_on_s3(dbs, spark, s3_log, filtering):
    """test_apply_differential.py's first case, the log in a bucket: each step's batch equals native's."""
    began = time.monotonic()
    dbs.create(DOC_PUBLISHER, DOC_TABLES)
    native = dbs.subscribe_native(("p1",))
    local = dbs.spec(("p1",), f"ours_{next(names)}", filtering)
    spec = SubscriptionSpec.from_dict({**json.loads(local.to_json()), "change_log": s3_log})
    run_ours(spec, spark)
    for step in DOC_STEPS:
        publish(dbs.publisher, [step])
        apply(spec, spark=spark)
        native.wait_caught_up()
        dbs.assert_same(("t1",))
    segments = open_change_log(spec).segments()
    assert segments and {segment_filtering(s.path) for s in segments} == {filtering}
    assert all(str(s.path).startswith(s3_log + "/") for s in segments)
    print(f"differential example on S3, {filtering}: {time.monotonic() - began:.1f} s")
