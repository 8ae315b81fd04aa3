"""The change log on object storage (change_log/store.py) against the run's S3-compatible server on 127.0.0.1."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.change_log.identity import LogIdentity, LogNeeds
from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.change_log.segment_reader import read_segments, segment_relations
from airflow_provider_rowfilter.change_log.segment_schema import SCHEMA
from airflow_provider_rowfilter.change_log.segment_writer import SegmentWriter
from airflow_provider_rowfilter.change_log.store import ObjectStoreLog, open_change_log
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from tests.change_log.log_messages import T1, TS_US, fetch, insert, tup


def spec_on(url: str) -> SubscriptionSpec:
    return SubscriptionSpec(subscription="s1", publications=("p1",), change_log=url)


def write(log: ObjectStoreLog, start: int, end: int, rows: int = 1):
    with log.writing():
        writer = SegmentWriter(log, start)
        if rows:
            writer.append(fetch([(end - 1, TS_US, 7, None)],
                                [(0, i, start + 1 + i, T1, insert(tup(str(i), "x"))) for i in range(rows)]))
            writer.end_transactions(1)
        return writer.finish(end)


def test_segments_chain_in_the_bucket_and_the_log_keeps_its_identity(s3, s3_log):
    """Issue 32, item 1: the same log as a directory: names, chain, position object, id, continuity."""
    log = open_change_log(spec_on(s3_log))
    assert isinstance(log, ObjectStoreLog) and log.segments() == [] and log.captured_through() is None
    first = write(log, 100, 200, rows=3)
    log.record_position(200, "rowfilter_s1")
    write(log, 200, 300, rows=0)  # a heartbeat: an empty segment, still in the chain
    bucket, prefix = s3_log[len("s3://"):].split("/", 1)
    assert s3.keys(bucket) == [f"{prefix}/0000000000000064-00000000000000C8.parquet",
                               f"{prefix}/00000000000000C8-000000000000012C.parquet", f"{prefix}/_position.json"]
    again = open_change_log(spec_on(s3_log))  # another machine: the same log, the same id
    assert [s.end_lsn for s in again.continuous(100, 300)] == [200, 300]
    assert again.captured_through() == 300
    identity = again.identity()
    assert identity == LogIdentity(log.identity().id, "", s3_log) and again.is_at(identity)
    assert identity.location == s3_log
    assert str(first.path) == f"{s3_log}/0000000000000064-00000000000000C8.parquet"
    assert read_segments(again.segments()).column("new_values").to_pylist() == [["0", "x"], ["1", "x"], ["2", "x"]]
    assert [s.table for s in segment_relations(again.segments()[0].path)] == ["t1"]
    # A lost segment is a hole in the chain: refused naming the URL, nothing assumed.
    again.segments()[0].path.unlink()
    with pytest.raises(ChangeLogError, match=rf"the change log '{s3_log}' is missing the changes from 0/64 to 0/C8"):
        again.continuous(100, 300, LogNeeds("s1", 100, (), identity))


def test_a_segment_cut_short_is_never_taken_for_a_whole_one(s3, s3_log):
    """A segment is visible whole or not at all; one that is not (put there by something else) stops the capture
    before it trusts it, naming it."""
    log = open_change_log(spec_on(s3_log))
    segment = write(log, 100, 200, rows=50)
    whole = segment.path.read_bytes()
    bucket, key = str(segment.path)[len("s3://"):].split("/", 1)
    s3.client().put_object(Bucket=bucket, Key=key, Body=whole[: len(whole) // 2])
    with pytest.raises(ChangeLogError, match=r"the change-log segment .*0000000000000064-00000000000000C8.parquet' is "
                       r"not whole"):
        log.captured_through()


def test_wrong_credentials_stop_with_the_store_s_error_and_the_fix(s3, s3_log, monkeypatch):
    log = open_change_log(spec_on(s3_log))
    write(log, 100, 200)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "expired")
    with pytest.raises(ChangeLogError, match=rf"could not list the change log '{s3_log}': .*SIGNATURE_DOES_NOT_MATCH"
                       r"(.|\n)*HINT:  check the store is reachable and the credentials"):
        open_change_log(spec_on(s3_log)).segments()


def test_drop_moves_the_log_aside_in_the_bucket(s3, s3_log):
    log = open_change_log(spec_on(s3_log))
    write(log, 100, 200)
    log.record_position(200, "rowfilter_s1")
    aside = log.retire()
    assert aside is not None and aside.startswith(s3_log + ".dropped-")
    assert log.segments() == [] and log.identity() is None
    bucket, prefix = s3_log[len("s3://"):].split("/", 1)
    objects = [k for k in s3.keys(bucket) if not k.endswith("/")]  # pyarrow keeps an emptied folder as "subs/"
    assert [k.split("/")[-1] for k in objects] == ["0000000000000064-00000000000000C8.parquet", "_position.json"]
    assert all(k.startswith(prefix + ".dropped-") for k in objects)


def test_spark_reads_the_store_s_objects_by_their_hadoop_urls():
    """A cluster's executors read s3a:// (hadoop-aws), abfss:// (hadoop-azure), gs:// and hdfs://; paths as they are."""
    from airflow_provider_rowfilter.spark.log_reader import hadoop_url
    assert [hadoop_url(u) for u in ("s3://b/p/x.parquet", "abfs://c@a.dfs.core.windows.net/p/x.parquet",
                                    "gs://b/x.parquet", "hdfs://nn:8020/x.parquet", "/data/s1/x.parquet")] == [
        "s3a://b/p/x.parquet", "abfss://c@a.dfs.core.windows.net/p/x.parquet", "gs://b/x.parquet",
        "hdfs://nn:8020/x.parquet", "/data/s1/x.parquet"]


def test_executors_read_the_segments_parts_with_the_access_the_driver_carries(s3, s3_log, monkeypatch):
    """spark/log_reader.py's way without a Hadoop connector: the task gets the store's variables in the task (a
    pickled StoreAccess), reads its share of a segment's row groups, and the parts make the segment exactly once;
    the access's repr shows no secret."""
    import pickle

    import pyarrow as pa

    from airflow_provider_rowfilter.change_log.segment_reader import read_parts, segment_parts
    from airflow_provider_rowfilter.change_log.store import StoreAccess

    log = open_change_log(spec_on(s3_log))
    with log.writing():
        writer = SegmentWriter(log, 100, row_group_rows=4)
        writer.append(fetch([(199, TS_US, 7, None)], [(0, i, 101 + i, T1, insert(tup(str(i), "x"))) for i in range(10)]))
        writer.end_transactions(1)
        segment = writer.finish(200)
    access = pickle.loads(pickle.dumps(StoreAccess.of(str(segment.path))))
    assert s3.secret_key not in repr(access) and "AWS_SECRET_ACCESS_KEY" in repr(access)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):  # an executor's bare environment
        monkeypatch.delenv(key)
    parts = segment_parts([str(segment.path)], [10], rows_per_part=5)
    assert [p[1:] for p in parts] == [(0, 2), (1, 2)]
    read = [pa.Table.from_batches(list(read_parts(access, parts, [pa.record_batch({"id": [i]})])), schema=SCHEMA)
            for i in range(len(parts))]
    assert [t.num_rows for t in read] == [8, 2]  # row groups of 4 rows: those starting in rows 0-4, then 5-9
    assert pa.concat_tables(read).equals(read_segments([segment]))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONG")  # the carried keys win over the executor's own
    assert sum(b.num_rows for b in read_parts(access, parts[:1], [pa.record_batch({"id": [0]})])) == 8


def test_a_killed_writer_s_staging_folder_is_removed_by_the_next(s3, s3_log, tmp_path, monkeypatch):
    """Issue 46 item 4: a writer killed while it stages a segment (SIGKILL: nothing of its own cleans up) leaves
    its local folder; the next writer of any log removes it, and never a live writer's."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again, as a new process would
    code = ("import sys, time\n"
            "from airflow_provider_rowfilter.change_log.store import open_change_log\n"
            "from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec\n"
            f"log = open_change_log(SubscriptionSpec(subscription='s1', publications=('p1',), change_log={s3_log!r}))\n"
            "with log.writing():\n    print('staging', flush=True)\n    time.sleep(120)\n")
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert writer.stdout.readline().strip() == "staging"
    [left] = [p for p in tmp_path.iterdir() if p.name.startswith(f"rowfilter-segment-{writer.pid}-")]
    live = tmp_path / f"rowfilter-segment-{os.getpid()}-busy"  # this process is alive: its folder stays
    live.mkdir()
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert left.is_dir()  # nothing of the killed writer removed it
    write(open_change_log(spec_on(s3_log)), 100, 200)
    assert not left.exists() and live.is_dir()
    assert [p.name for p in tmp_path.iterdir()] == [live.name]  # and the writer removed its own after it
