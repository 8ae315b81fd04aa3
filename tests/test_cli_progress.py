"""A long copy as a person sees it (issue 18, item 8): a live bar in a terminal, the same lines as before when piped.

Tested as it was found: the installed ``rowfilter snapshot`` in a tmux pane, read while it copies a table
large enough for several reports, and ``rowfilter resync --copy`` with its stderr in a file.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess

import psycopg
import pytest
import yaml
from rich.console import Console

from airflow_provider_rowfilter import cli
from airflow_provider_rowfilter.console.progress import BarHandler, bar_display
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec
from airflow_provider_rowfilter.flows.refresh import refresh
from airflow_provider_rowfilter.humane import PROGRESS_ATTR, ProgressReport
from tests.terminal import exe, tmux_screens

ROWS = 600_000
PUBLISHER = f"""
CREATE TABLE big (id int PRIMARY KEY, v text);
INSERT INTO big SELECT g, repeat('x', 40) FROM generate_series(1, {ROWS}) g;
ANALYZE big;
CREATE PUBLICATION pbig FOR TABLE big;
"""
#: The bar of the copy: its name, the bar itself (Rich's), the share, and what the report says beside it.
BAR = re.compile(r"^public\.big +━+\S* +(\d+)% +([\d,]+) (?:of ~([\d,]+) )?rows, [\d,]+ rows/s", re.M)


def subscribed(fresh_db, tmp_path, publisher: str, table: str, **spec) -> tuple[str, str]:
    """A publisher built by ``publisher``, the subscriber's ``table``, a spec file and a refresh; (spec file, publisher)."""
    pub, sub = fresh_db(), fresh_db()
    with psycopg.connect(pub, autocommit=True) as conn:
        conn.execute(publisher)
    with psycopg.connect(sub, autocommit=True) as conn:
        conn.execute(table)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"publisher": pub, "subscriber": sub, "change_log": str(tmp_path / "log"),
                                    "spark_master": "local[2]", **spec}))
    refresh(SubscriptionSpec.load(str(path)))
    return str(path), pub


@pytest.fixture
def big(fresh_db, tmp_path) -> str:
    """A subscription of one unfiltered table of ``ROWS`` rows (the publisher's estimate is known), refreshed."""
    return subscribed(fresh_db, tmp_path, PUBLISHER, "CREATE TABLE big (id int PRIMARY KEY, v text)",
                      subscription="bars", publications=["pbig"])[0]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_copy_in_a_terminal_shows_a_live_bar_that_ends_complete(big):
    screens = tmux_screens(["snapshot", "--spec", big, "--progress-interval", "0.05"], 120, timeout=180, every=0.1)

    final = screens[-1]
    # While it copied, the bar moved: at least two readings short of the end, each of the estimate.
    moving = {m.groups() for screen in screens[:-1] for m in BAR.finditer(screen) if m.group(3)}
    assert len({done for share, done, _ in moving if int(share) < 100}) >= 2, screens
    assert {total for _, _, total in moving} == {f"{ROWS:,}"}, moving  # of the publisher's estimate
    # It ends complete: the whole bar, every row, and the command's own summary after it.
    (end,) = BAR.findall(final)  # one bar, redrawn in place
    assert end[:2] == ("100", f"{ROWS:,}") and "done in" in final, final
    assert f"public.big: state f ({ROWS:,} rows, consistent with" in final, final
    # The bar replaces the lines: none of them in the terminal.
    assert "rows copied in" not in final and "airflow_provider_rowfilter.progress" not in final, final
    assert "[Stage " not in final, final  # nor Spark's own console progress bar beside ours


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_copy_that_fails_in_a_terminal_ends_its_bar_as_failed(fresh_db, tmp_path):
    """The rows arrive, then one breaks a CHECK of the subscriber's table: the bar, full of rows since rolled
    back, says the copy failed, above the error and its HINT."""
    path, _ = subscribed(fresh_db, tmp_path, PUBLISHER + "UPDATE big SET v = 'x' WHERE id = 550000;",
                         "CREATE TABLE big (id int PRIMARY KEY, v text CHECK (v <> 'x'))",
                         subscription="bars", publications=["pbig"])
    screens = tmux_screens(["snapshot", "--spec", path, "--progress-interval", "0.05"], 120, timeout=180, every=0.1,
                           status=1)
    final = screens[-1]
    assert re.search(r"^public\.big +━+\S* +\d+% failed$", final, re.M), final
    assert 'violates check constraint "big_v_check"' in final and "HINT:" in final, final


def test_a_piped_copy_logs_lines_as_before(big, tmp_path):
    err = tmp_path / "stderr.txt"
    with err.open("w") as f:
        done = subprocess.run([exe(), "resync", "--spec", big, "--table", "public.big", "--copy",
                               "--progress-interval", "0.05"], stdout=subprocess.PIPE, stderr=f, text=True,
                              timeout=180, check=False, env={**os.environ, "FORCE_COLOR": "1"})  # as CI sets it
    text = err.read_text()
    assert done.returncode == 0, text
    lines = re.findall(r"^INFO airflow_provider_rowfilter\.progress: public\.big: ([\d,]+) rows copied in .*$",
                       text, re.M)
    assert len(lines) >= 2, text  # one line a report, as in a task log
    assert "━" not in text and "done in" not in text and "\x1b[" not in text, text  # no bar, no final report
    assert f"public.big: state f ({ROWS:,} rows" in done.stdout, done.stdout


def with_backlog(fresh_db, tmp_path, subscriber_table: str = "CREATE TABLE t (id int PRIMARY KEY, v text)") -> str:
    """A subscription without a copy (its table ready at once) and a backlog of 60 transactions behind it,
    of 10 rows each; the 40th writes ``v = 'bad'``."""
    path, pub = subscribed(fresh_db, tmp_path, "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pt "
                           "FOR TABLE t", subscriber_table, subscription="drain", publications=["pt"], copy_data=False)
    with psycopg.connect(pub, autocommit=True) as conn:
        for n in range(60):
            conn.execute("INSERT INTO t SELECT g, %s FROM generate_series(%s::int, %s::int) g",
                         ("bad" if n == 40 else "v", n * 10, n * 10 + 9))
    return path


@pytest.fixture
def backlog(fresh_db, tmp_path) -> str:
    return with_backlog(fresh_db, tmp_path)


#: The bar of a drain: the subscription, the bar, the share of the WAL to the run's target, the batches so far.
DRAIN = re.compile(r"^drain +━+\S* +(\d+)% +(\d+) batch\(es\), ([\d,]+) changes", re.M)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_drain_in_a_terminal_shows_the_wal_left_and_ends_complete(backlog):
    screens = tmux_screens(["apply", "--spec", backlog, "--max-changes", "60"], 160, timeout=240, every=0.1)

    final = screens[-1]
    moving = {m.groups() for screen in screens[:-1] for m in DRAIN.finditer(screen)}
    assert len({batches for share, batches, _ in moving if int(share) < 100}) >= 2, screens
    assert any("of WAL to the run's target" in screen and " left" in screen for screen in screens[:-1]), screens
    (end,) = DRAIN.findall(final)  # one bar, redrawn in place: Spark's lines are printed above it
    assert end[0] == "100" and "drained in" in final, final
    assert "applied 600 changes in" in final and "public.t: insert 600" in final, final
    assert "airflow_provider_rowfilter.progress" not in final, final


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_progress_interval_that_is_not_a_positive_number_is_refused(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["snapshot", "--spec", "s1.yaml", "--progress-interval", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--progress-interval" in err and "is not a number of seconds" in err, err


def test_bars_draw_names_and_reports_as_text_and_end_as_the_job_ended():
    """The handler on its own, drawn by Rich to a file: a name with Rich's markup characters, a copy that
    failed after its first report, and one that ended before its first (no bar)."""
    out = io.StringIO()
    progress = bar_display(Console(file=out, width=160, color_system=None, markup=False))
    bars = BarHandler(progress)
    name = 'public."t[/x] [bold]"'
    for report in (
        ProgressReport("copy", name, 50, 100, "50 of ~100 rows, 10 rows/s [red]", "line"),
        ProgressReport("copy", name, None, None, "failed", "line", final=True),
        ProgressReport("copy", "public.short", 3, 3, "3 rows, done", "line", final=True),
    ):
        bars.handle(logging.makeLogRecord({"msg": report.line, "levelno": logging.INFO, PROGRESS_ATTR: report}))
    progress.console.print(progress.get_renderable())
    (line,) = out.getvalue().strip().splitlines()
    assert line.startswith(f"{name} ") and re.search(r" 50% failed$", line), line  # its last reading, then failed


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_drain_that_fails_in_a_terminal_ends_its_bar_as_failed(fresh_db, tmp_path):
    """Batches apply, then one holds a row the subscriber's CHECK refuses: the bar stops where the run did
    and says it failed, above the error."""
    path = with_backlog(fresh_db, tmp_path, "CREATE TABLE t (id int PRIMARY KEY, v text CHECK (v <> 'bad'))")
    screens = tmux_screens(["apply", "--spec", path, "--max-changes", "60"], 160, timeout=240, every=0.1, status=1)
    final = screens[-1]
    assert any(DRAIN.search(screen) for screen in screens[:-1]), screens  # it reported before it failed
    assert re.search(r"^drain +━+\S* +\d+% failed$", final, re.M), final
    assert 'violates check constraint "t_v_check"' in final, final
