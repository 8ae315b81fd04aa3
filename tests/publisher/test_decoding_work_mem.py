"""The spec's logical_decoding_work_mem: read as PostgreSQL reads the setting, and set for the capture's session."""

from __future__ import annotations

import time

import psycopg
import pytest
import yaml
from psycopg import sql

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.memory_setting import DECODING_WORK_MEM_RANGE, memory_kb
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.publisher import capture as capture_module
from airflow_provider_rowfilter.publisher.capture import capture

VALUES = ["256MB", "1GB", " 1.5GB ", "64", "65536", "64kB", "65536 B", "0x100", "0100", "1e3", "2.5MB",
          "2047GB", "63", "1000B", "-1", "2TB", "10 mb", "256 M", "abc", "", "09", "1MBx", "1.5"]


def test_a_value_is_taken_or_refused_as_postgresql_does(local_pg):
    """PostgreSQL is the referee: each value SET in a session of the test cluster, against ours."""
    with psycopg.connect(local_pg.dsn(), autocommit=True) as conn:
        for value in VALUES:
            try:
                conn.execute(sql.SQL("SET logical_decoding_work_mem = {}").format(sql.Literal(value)))
            except psycopg.Error as e:
                with pytest.raises(SpecError) as ours:
                    memory_kb(value, "logical_decoding_work_mem", *DECODING_WORK_MEM_RANGE, "spec")
                assert e.diag.message_primary in str(ours.value), value
                if e.diag.message_hint:
                    assert ours.value.hint == e.diag.message_hint, value
                continue
            theirs = int(conn.execute("SELECT setting FROM pg_settings "
                                      "WHERE name = 'logical_decoding_work_mem'").fetchone()[0])
            assert memory_kb(value, "logical_decoding_work_mem", *DECODING_WORK_MEM_RANGE, "spec") == theirs, value


def _spilled(pub: str) -> int:
    with psycopg.connect(pub) as conn:
        return conn.execute("SELECT coalesce(sum(spill_txns), 0) FROM pg_stat_replication_slots "
                            "WHERE slot_name = 'rowfilter_s1'").fetchone()[0]


def test_the_captures_session_decodes_with_the_specs_setting(fresh_db, tmp_path, monkeypatch):
    """A transaction larger than the spec's 64kB is spilled by the capture's decoding; with the server's 64MB it is
    not (pg_stat_replication_slots, PostgreSQL 14+): the setting is the capture session's, and only its."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text); CREATE PUBLICATION p FOR TABLE t")
    spec_data = {"subscription": "s1", "publisher": pub, "subscriber": sub, "publications": ["p"],
                 "change_log": str(tmp_path / "changes")}
    path = tmp_path / "s1.yaml"
    seen: list[str] = []
    read_slot = capture_module._read_slot

    def showing(pub_conn, *args, **kwargs):  # what the session that reads the slot has set
        seen.append(pub_conn.execute("SHOW logical_decoding_work_mem").fetchone()[0])
        return read_slot(pub_conn, *args, **kwargs)

    monkeypatch.setattr(capture_module, "_read_slot", showing)
    spilled = []
    for setting, first in ((None, 0), ("64kB", 3000)):
        path.write_text(yaml.safe_dump({**spec_data, **({"logical_decoding_work_mem": setting} if setting else {})}))
        spec = SubscriptionSpec.load(path)
        if setting is None:
            refresh(spec)
        with psycopg.connect(pub, autocommit=True) as conn:  # about 300 kB of changes in one transaction
            conn.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(%s::int, %s::int) g",
                         (first, first + 2999))
        assert capture(spec).changes == 3000
        deadline = time.monotonic() + 10  # the capture's backend reports its counts as it exits
        while (count := _spilled(pub)) == (spilled[-1] if spilled else 0) and time.monotonic() < deadline and setting:
            time.sleep(0.1)
        spilled.append(count)
    assert seen == ["64MB", "64kB"]
    assert spilled[0] == 0 and spilled[1] >= 1
