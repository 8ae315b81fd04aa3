"""What a person sees of ``rowfilter status`` and ``validate`` (issue 18, items 6, 7 and 10).

Tested as it was found: the installed command in a pseudo-terminal of 80 and of 200 columns, and
piped to a file. An LSN or a table name is never split across lines; piped output is plain rows, as
wide as they need; ``--format tsv|json``; the live lag and the last batch's are told apart, each
with when it was measured; a table reset to ``i`` shows no counts of an older batch.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from airflow_provider_rowfilter import __version__, cli
from tests.status_scenario import ERROR, LONG, status_scenario
from tests.terminal import exe, in_tmux


def in_terminal(args: list[str], columns: int) -> str:
    """What a terminal ``columns`` wide shows of the command: a tmux pane's screen when tmux is installed
    (how the issue was found), else what a pseudo-terminal of that size received, colours removed."""
    if shutil.which("tmux"):
        return in_tmux(args, columns)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    proc = subprocess.Popen([exe(), *args], stdin=follower, stdout=follower, stderr=follower, env={**env, "TERM": "xterm"})
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output in 120 s: {out!r}")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0, out
    os.close(leader)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.decode()).replace("\r\n", "\n")


def piped(args: list[str], tmp_path: Path) -> str:
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        subprocess.run([exe(), *args], stdout=f, stderr=subprocess.PIPE, check=True, timeout=120)
    return out.read_text()


@pytest.fixture
def subscription(fresh_db, tmp_path):
    return status_scenario(fresh_db, tmp_path)


def lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


@pytest.mark.parametrize("columns", [80, 200])
def test_status_in_a_terminal_never_splits_an_lsn_or_a_name(subscription, columns):
    path, lsn = subscription
    out = in_terminal(["status", "--spec", path], columns)
    assert all(len(line) <= columns for line in out.splitlines()), out  # the command wrapped, not the terminal
    assert LONG in out and lsn in out  # each whole (they were folded at 80 columns)
    if columns == 200:  # a table, one row a line
        (row,) = lines_with(out, LONG)
        assert lsn in row and "r ready" in row and "1,234,567" in row, out
    else:  # too narrow for every column: one line a table, its details under it (issue 29 item 8)
        (row,) = lines_with(out, LONG)
        assert lsn in row and "r ready" in row and "RECORD" not in out, out
        assert re.search(r"^  rows copied: 1,234,567$", out, re.M) and "\n  last batch: insert 3, skipped 2\n" in out, out
        assert re.search(r"^filtering: (source|spark)$", out, re.M), out  # the same for both tables: once
        assert len(out.splitlines()) <= 14, out
    # what is live and what is from the batch, each with when
    assert re.search(r"last batch 1 applied 20 min( \d+ s)? ago", out) and "11.9 s behind the publisher then" in out, out
    assert "11.852699" not in out and "None" not in out
    assert "insert 3, skipped 2" in out  # the skip is not "nothing"
    assert "insert 9" not in out  # t2 was reset to i since that batch: not its counts any more


def test_status_piped_is_plain_rows_as_wide_as_they_need(subscription, tmp_path):
    path, lsn = subscription
    out = piped(["status", "--spec", path], tmp_path)
    assert not re.search(r"[│┃─━┏┗╭╰]", out), out  # no box drawing
    assert "\x1b[" not in out  # no colour
    (row,) = lines_with(out, LONG)
    assert lsn in row and "1,234,567" in row and "insert 3, skipped 2" in row
    # the error's two lines on the table's one row, never wrapped at 80
    assert 'violates unique constraint "t2_pkey" DETAIL:' in row and len(row) > 80
    (t2,) = [line for line in out.splitlines() if line.startswith("public.t2 ")]
    assert "i init" in t2 and lsn not in t2


def test_status_as_tsv_and_json(subscription, tmp_path):
    path, lsn = subscription
    out = piped(["status", "--spec", path, "--format", "tsv"], tmp_path)
    header, *rows = out.splitlines()
    assert header.split("\t") == [c.name for c in cli.STATUS_COLUMNS]
    by_table = {r.split("\t")[0]: dict(zip(header.split("\t"), r.split("\t"), strict=True)) for r in rows}
    assert by_table[f"public.{LONG}"]["lsn"] == lsn
    assert by_table[f"public.{LONG}"]["last error"] == ERROR.replace("\n", "\\n")  # one line, escaped as COPY does
    assert (by_table["public.t2"]["state"], by_table["public.t2"]["lsn"]) == ("i init", "")
    assert by_table["public.t2"]["filtering"] in ("source", "spark", "unknown")

    doc = json.loads(piped(["status", "--spec", path, "--format", "json"], tmp_path))
    same = json.loads(piped(["status", "--spec", path, "--json"], tmp_path))
    def steady(d: dict) -> list[dict]:  # lag_bytes is measured now: the cluster's WAL moves between two runs
        return [{k: v for k, v in t.items() if k != "lag_bytes"} for t in d["tables"]]

    assert steady(doc) == steady(same) and doc.keys() == same.keys()
    tables = {t["table"]: t for t in doc["tables"]}
    assert tables[f"public.{LONG}"]["lsn"] == lsn and tables[f"public.{LONG}"]["last_batch"] == {"insert": 3, "skipped": 2}
    assert tables["public.t2"]["last_batch"] == {} and tables["public.t2"]["lag_seconds"] is None
    assert 1190 < doc["last_batch"]["age_seconds"] < 1300 and doc["measured_at"]


def test_validate_piped_and_as_tsv(subscription, tmp_path):
    path, _ = subscription
    out = piped(["validate", "--spec", path], tmp_path)
    (row,) = lines_with(out, LONG)
    assert "((id > 5) AND (note <> 'a fairly long literal'::text))" in row, out
    assert not re.search(r"[│┃─━]", out)
    header, *rows = piped(["validate", "--spec", path, "--format", "tsv"], tmp_path).splitlines()
    assert header.split("\t")[0] == "table" and len(rows) == 2
    assert in_terminal(["validate", "--spec", path], 80).count(LONG) == 1  # the name whole, once


def test_help_is_plain_text_with_an_example_per_command_and_a_version():
    top = subprocess.run([exe(), "--help"], capture_output=True, text=True, check=True).stdout
    assert "``" not in top and ":func:" not in top
    for name in cli.COMMANDS:
        assert name in top
        text = subprocess.run([exe(), name, "--help"], capture_output=True, text=True, check=True).stdout
        assert "``" not in text and f"example:\n  rowfilter {name} --spec" in text, text
        assert len(text.split("\n\n")[1]) > 40, text  # a description, not only the usage
    server = subprocess.run([exe(), "spark-server", "--help"], capture_output=True, text=True, check=True).stdout
    assert "example:\n  rowfilter spark-server start" in server and len(server.split("\n\n")[1]) > 40, server
    version = subprocess.run([exe(), "--version"], capture_output=True, text=True, check=True).stdout
    assert version.strip() == f"rowfilter {__version__}"


def test_format_and_json_together_are_refused(subscription):
    path, _ = subscription
    result = subprocess.run([exe(), "status", "--spec", path, "--format", "tsv", "--json"], capture_output=True, text=True)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


def test_disable_enable_and_drop_are_said_by_status_and_apply(subscription, capsys):
    """Issue 29 items 5 and 9: ALTER SUBSCRIPTION … DISABLE/ENABLE; a dropped subscription says so."""
    path, _ = subscription
    assert cli.main(["disable", "--spec", path]) == 0
    assert "disabled; the apply applies nothing until `rowfilter enable`" in capsys.readouterr().out
    assert cli.main(["status", "--spec", path, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["enabled"] is False
    assert cli.main(["status", "--spec", path]) == 0
    assert "DISABLED: nothing is applied until `rowfilter enable`" in capsys.readouterr().out
    assert cli.main(["apply", "--spec", path]) == 0  # no batch, no Spark: says why
    assert "subscription s1: disabled: nothing applied (`rowfilter enable` enables it)" in capsys.readouterr().out
    assert cli.main(["enable", "--spec", path]) == 0
    assert "enabled; the next apply goes on from where it stopped" in capsys.readouterr().out

    assert cli.main(["drop", "--spec", path]) == 0
    capsys.readouterr()
    assert cli.main(["status", "--spec", path]) == 1
    err = capsys.readouterr().err
    assert re.search(r"subscription 's1' was dropped at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(DROP SUBSCRIPTION\)", err), err
    assert "run `rowfilter refresh`" not in err.split("HINT:")[0]
