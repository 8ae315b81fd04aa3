"""``rowfilter validate`` on mutated spec and publications files: never a traceback, never a hang (issue 42, item 4).

A bounded fuzzer (hypothesis, derandomized: the same examples every run) mutates a valid spec file and a valid
publications file byte by byte and runs the command in process (cli ``main``) against a real publisher. Every run
must end with exit status 0, or 1/2 with an ``ERROR:`` line, and no Python traceback, within its deadline. The
review's findings are its explicit examples.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_provider_rowfilter.cli import main

SPEC = b"""\
subscription: s1
publications: [p1, p2]
publications_ddl: pubs.sql
apply_schedule: '*/5 * * * *'
spark_conf: {spark.sql.shuffle.partitions: 2}
"""
DDL = b"""\
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (id > 5 AND id IN (1, 2, 3));
CREATE PUBLICATION p2 FOR TABLE t2 (d) WITH (publish = 'insert');
"""
P2 = b"\nCREATE PUBLICATION p2 FOR TABLE t2;\n"
#: What the mutations insert: the bytes and tokens that broke the command before.
PIECES = [b"\x00", b"\xe9", b"\xff\xfe", b"(", b")", b"NOT ", b"'", b"$$", b"E'\\'", b'"', b"[", b"{", b"\n",
          b" OR id = 1", b"- ", b"--", b"/*", b";", b"\t", b": ", b"10" * 40]
#: The deadline of one run of the command (the 100,000-item IN list takes ~10 s on a loaded 2-core machine).
DEADLINE = 60


def _filter(text: str) -> bytes:
    return f"CREATE PUBLICATION p1 FOR TABLE t1 WHERE ({text});".encode() + P2


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    target = draw(st.sampled_from(["spec", "ddl"]))
    data = bytearray(SPEC if target == "spec" else DDL)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "repeat"]))
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.sampled_from(PIECES))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 20))]
        else:
            piece = draw(st.sampled_from(PIECES))
            data[at:at] = piece * draw(st.integers(50, 3000))
    return target, bytes(data)


@pytest.fixture(scope="module")
def publisher(local_pg) -> str:
    dsn = local_pg.create_database("t_validate_fuzz")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, a int, c text); CREATE TABLE t2 (d int PRIMARY KEY, e int)")
    yield dsn
    local_pg.drop_database("t_validate_fuzz")


@pytest.mark.timeout(900)
@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=mutated())
@example(case=("spec", b"subscription: bad\xe9\npublications: [p1]\n"))
@example(case=("spec", (b"subscription: s1\npublications: [p1]\n").decode().encode("utf-16")))
@example(case=("spec", SPEC.replace(b"s1", b"s\xb1", 1)))
@example(case=("spec", b"subscription: s1\npublications: " + b"[" * 3000 + b"]" * 3000 + b"\n"))
@example(case=("spec", SPEC + b"apply_schedule: 1" + b"0" * 300 + b"\n"))
@example(case=("spec", SPEC.replace(b"subscription: s1", b'subscription: "a\\0b"')))
@example(case=("spec", SPEC.replace(b"pubs.sql", b"fifo.sql")))
@example(case=("ddl", b"CREATE PUBLICATION p1 FOR TABLE t1 WHERE (c = 'Gen\xe8ve');" + P2))
@example(case=("ddl", _filter("(" * 60 + "id > 1" + ")" * 60)))
@example(case=("ddl", _filter("NOT " * 3000 + "id > 1")))
@example(case=("ddl", _filter(" OR ".join(f"id = {i}" for i in range(20_000)))))
@example(case=("ddl", _filter("id IN (" + ", ".join(map(str, range(100_000))) + ")")))
@example(case=("ddl", _filter("c = $x$" + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY" + "$x$ AND a = 1 ++ 2")))
def test_validate_ends_with_a_message_never_a_traceback_nor_a_hang(publisher: str, case: tuple[str, bytes]) -> None:
    target, data = case
    folder = Path(tempfile.mkdtemp(prefix="rowfilter-fuzz-"))
    try:
        spec, ddl = (data, DDL) if target == "spec" else (SPEC, data)
        # The publisher's line is never mutated: a mangled host name would wait on a name lookup, not on us.
        (folder / "s1.yaml").write_bytes(spec + f"\npublisher: '{publisher}'\n".encode())
        (folder / "pubs.sql").write_bytes(ddl)
        os.mkfifo(folder / "fifo.sql")  # no writer ever opens it: reading it would block for good
        out, err = io.StringIO(), io.StringIO()
        began = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", "--json", "--spec", str(folder / "s1.yaml")])  # any exception fails the test
        took = time.monotonic() - began
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    said = err.getvalue()
    assert took < DEADLINE, (took, said[:500])
    assert "Traceback" not in said, said[-3000:]
    assert code in (0, 1, 2), (code, said[-3000:])
    if code:
        assert said.startswith("ERROR: ") and len(said.strip()) > len("ERROR: "), said[-3000:]
    else:
        assert '"tables"' in out.getvalue()
    assert "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY" not in said  # a secret-looking literal is masked in excerpts
