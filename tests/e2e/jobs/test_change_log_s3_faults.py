"""Faults of object storage under a capture (issue 32, "Proof"): each stops the run with a clear error and loses
nothing; the next run goes on. Caused for real by a proxy on 127.0.0.1 between pyarrow's S3 client and the
S3-compatible server (tests/s3_faults.py); the jobs get the proxy as their ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import json
import re
import time

import psycopg
import pytest
import yaml

from airflow_provider_rowfilter.change_log.store import TIMEOUT_ENV, open_change_log
from airflow_provider_rowfilter.core.lsn import parse_lsn
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.jobs import capture as capture_job
from tests.s3_faults import fault_proxy

ROWS = 2000


@pytest.fixture
def proxied(s3, fresh_db, tmp_path, monkeypatch):
    """A subscription whose change log is in a bucket reached through the fault proxy; 2,000 changes waiting."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (a int PRIMARY KEY, b text); CREATE PUBLICATION p1 FOR TABLE t1")
    url = f"s3://{s3.bucket()}/subs/s1"
    path = tmp_path / "s1.yaml"
    path.write_text(yaml.safe_dump({"subscription": "s1", "publisher": pub, "subscriber": sub,
                                    "publications": ["p1"], "filtering": "spark", "change_log": url}))
    spec = SubscriptionSpec.load(path)
    refresh(spec)
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(f"INSERT INTO t1 SELECT g, repeat('v', 200) || g FROM generate_series(1, {ROWS}) g")
    with fault_proxy(s3.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv(TIMEOUT_ENV, "1")  # a request unanswered for 1 s fails (30 s by default)
        yield proxy, pub, path, spec


def slot(pub: str) -> int:
    with psycopg.connect(pub) as conn:
        return parse_lsn(conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                      "WHERE slot_name = 'rowfilter_s1'").fetchone()[0])


@pytest.mark.parametrize(("fault", "message"), [
    ("cut-put", r"could not write the segment [0-9A-F-]+\.parquet to the change log 's3://"),
    ("hang", r"could not write the segment [0-9A-F-]+\.parquet to the change log 's3://"),
    ("expired", r"could not (list|read the position of) the change log 's3://.*(ExpiredToken|token has expired)"),
    ("slow-list", r"could not list the change log 's3://"),
], ids=["put-cut-half-way", "put-timeout", "expired-credentials", "listing-slower-than-the-timeout"])
def test_a_store_fault_stops_the_capture_clearly_and_the_next_run_loses_nothing(proxied, capsys, fault, message):
    proxy, pub, path, spec = proxied
    began, before = time.monotonic(), slot(pub)
    proxy.fault, proxy.slow_seconds = fault, 3.0
    assert capture_job.main(["--spec", str(path)]) == 1
    err = capsys.readouterr().err
    assert proxy.hits and re.search(message, err), err[-3000:]
    assert "HINT:  check the store is reachable and the credentials" in err
    proxy.fault = None
    assert slot(pub) == before  # nothing advanced: the slot keeps every change
    assert open_change_log(spec).segments() == []  # and no segment, whole or cut, is in the bucket
    assert capture_job.main(["--spec", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["changes"] == ROWS and slot(pub) == parse_lsn(summary["end_lsn"])
    print(f"{fault}: {time.monotonic() - began:.1f} s")


def test_a_slow_listing_is_waited_for(proxied, capsys, monkeypatch):
    """A listing answered in 1.5 s (under the client's timeout, 5 s here) slows the capture; it completes."""
    proxy, pub, path, _ = proxied
    monkeypatch.setenv(TIMEOUT_ENV, "5")
    proxy.fault, proxy.slow_seconds = "slow-list", 1.5
    proxy.requests.clear()
    assert capture_job.main(["--spec", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(f"one capture's requests to the store: {proxy.requests}")
    assert proxy.hits and summary["changes"] == ROWS and slot(pub) == parse_lsn(summary["end_lsn"])
