"""Spark's own ports and scratch files against another OS user (uid 65534): the review after issue 28, items 2 and 8(d).

Found: the Connect server answered its token only, but the JVM behind it, and every local session of the jobs,
listened on a driver RPC port and a block manager port with ``spark.authenticate`` off; another user of the
host fetched a session's cached rows from the block manager with a few lines of Python (tests/spark_wire.py).
Shuffle and spill files went to the system's temporary directory under the umask. Now both ports ask for the
secret Spark makes in each JVM (spark/settings.py ``network_security``) and the scratch files are in a 0700
directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from airflow_provider_rowfilter.spark import connect_server
from airflow_provider_rowfilter.spark.session import session_conf
from airflow_provider_rowfilter.spark.settings import (
    NETWORK_AUTH_SETTINGS,
    network_security,
    wants_local_dir,
)
from tests.attacker import as_root_only, run_as_nobody
from tests.ports import listening_ports

SASL_REFUSAL = "Expected SaslMessage"  # the server's answer to a request before authenticating


def _attack(host: str, ports: dict[str, int], block: str) -> str:
    """uid 65534's attempt on each port: the block ``block`` asked for, and an RPC sent to it."""
    done = run_as_nobody(f"""
        import socket
        from tests.spark_wire import fetch_block, rpc
        for name, port in {ports!r}.items():
            try:
                print(name, "fetch", fetch_block({host!r}, port, {block!r}))
            except OSError as e:
                print(name, "fetch", type(e).__name__)
            try:
                with socket.create_connection(({host!r}, port), timeout=20) as sock:
                    print(name, "rpc", rpc(sock, b"\\x00not a request"))
            except OSError as e:
                print(name, "rpc", type(e).__name__)
    """, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@as_root_only
def test_another_os_user_cannot_fetch_a_session_s_blocks_nor_call_its_driver(spark):
    from pyspark import StorageLevel

    sc = spark.sparkContext
    marker = "rows-of-another-user-7f3a"
    cached = sc.parallelize([marker] * 3, 1).persist(StorageLevel.MEMORY_ONLY)
    try:
        assert cached.count() == 3  # the job runs, its block is in the block manager
        block_manager = sc._jsc.sc().env().blockManager().blockManagerId()
        ports = {"block-manager": block_manager.port(), "driver": int(sc.getConf().get("spark.driver.port"))}
        out = _attack(block_manager.host(), ports, f"rdd_{cached.id()}_0")
    finally:
        cached.unpersist()
    assert marker not in out, out
    assert out.count(SASL_REFUSAL) == 4, out  # both requests on both ports: refused before authentication
    # Spark made the secret in the JVM: in no setting, not on its command line, not in its environment.
    conf = dict(sc.getConf().getAll())
    assert conf["spark.authenticate"] == "true"
    assert "spark.authenticate.secret" not in conf
    secret = sc._jsc.sc().env().securityManager().getSecretKey()
    jvm = sc._jvm.java.lang.ProcessHandle.current().pid()
    assert len(secret) >= 32
    for part in ("cmdline", "environ"):
        assert secret.encode() not in Path(f"/proc/{jvm}/{part}").read_bytes()


@as_root_only
def test_another_os_user_cannot_call_the_connect_server_s_spark_ports(spark_connect_server):
    grpc_port = int(spark_connect_server.url.rsplit(":", 1)[1])
    ports = {f"port-{p}": p for p in listening_ports(spark_connect_server.pid) if p != grpc_port}
    assert len(ports) >= 2, ports  # the driver's RPC and the block manager (the Connect port is the token's)
    out = _attack("127.0.0.1", ports, "rdd_0_0")
    assert out.count(SASL_REFUSAL) == 2 * len(ports), out
    command = Path(f"/proc/{spark_connect_server.pid}/cmdline").read_bytes().split(b"\0")
    assert b"spark.authenticate=true" in command and not any(b"secret" in part for part in command)


@as_root_only
def test_spark_s_scratch_files_are_its_user_s_alone(spark, spark_connect_server):
    # Where the session's block manager keeps its files (given as SPARK_LOCAL_DIRS to the JVM started here).
    blockmgr = [str(f) for f in spark.sparkContext._jsc.sc().env().blockManager().diskBlockManager().localDirs()]
    assert len(blockmgr) == 1 and Path(blockmgr[0]).name.startswith("blockmgr-")
    local_dirs = [str(Path(blockmgr[0]).parent), spark_connect_server.local_dir]
    assert Path(local_dirs[0]).name.startswith("rowfilter-spark-") and "SPARK_LOCAL_DIRS" not in os.environ
    for path in local_dirs:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    done = run_as_nobody(f"""
        import os
        for path in {local_dirs!r}:
            try:
                print(os.listdir(path))
            except OSError as e:
                print(type(e).__name__)
    """)
    assert done.stdout.split() == ["PermissionError", "PermissionError"], done.stdout + done.stderr


@pytest.mark.parametrize("master, expected", [
    ("local[*]", NETWORK_AUTH_SETTINGS), ("local", NETWORK_AUTH_SETTINGS), ("local[4, 2]", NETWORK_AUTH_SETTINGS),
    ("yarn", {}), ("k8s://https://k8s.example:6443", {}),
    ("spark://master.example:7077", {}), ("local-cluster[2, 1, 1024]", {})])
def test_spark_asks_for_its_secret_where_this_package_starts_it(master, expected):
    """A local master asks for Spark's own secret; a cluster is left to its own configuration."""
    assert network_security(master) == expected
    assert {k: v for k, v in session_conf(master).items() if k in NETWORK_AUTH_SETTINGS} == expected
    # A user's own choice stands (a standalone cluster whose spark-defaults.conf holds a secret, say).
    assert session_conf(master, {"spark.authenticate": "false"})["spark.authenticate"] == "false"


def test_the_scratch_directory_is_given_to_a_local_master_unless_one_is_chosen():
    assert wants_local_dir({"spark.master": "local[2]"}, {})
    assert not wants_local_dir({"spark.master": "local[2]", "spark.local.dir": "/srv/spark"}, {})
    assert not wants_local_dir({"spark.master": "local[2]"}, {"SPARK_LOCAL_DIRS": "/srv/spark"})
    assert not wants_local_dir({"spark.master": "yarn"}, {})  # a path here would not exist on the executors
    command = connect_server.server_command(15002)
    settings = dict(command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--conf")
    assert settings["spark.authenticate"] == "true" and "spark.local.dir" not in settings
