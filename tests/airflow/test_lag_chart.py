"""The Replication page's chart: its time axis fits its data (issue 46 item 4), pure, no database."""

from __future__ import annotations

import datetime as dt
import re

from airflow_provider_rowfilter.plugins.lag_chart import LEFT, MIN_SPAN, RIGHT, WIDTH, Point, render, span_of

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
SIX_HOURS = 6 * 3600.0


def bars(svg: str) -> list[float]:
    return [float(x) for x in re.findall(r'<rect x="([\d.]+)"[^>]*><title>batch', svg)]


def test_a_new_subscription_fills_the_chart():
    points = [Point(NOW - dt.timedelta(seconds=s), 10, 0.0, i) for i, s in enumerate((170, 110, 50))]
    assert span_of(points, [], NOW, SIX_HOURS) == MIN_SPAN  # three minutes of batches: a ten-minute axis
    svg = render(points, [], NOW, SIX_HOURS)
    xs = bars(svg)
    plot = WIDTH - LEFT - RIGHT
    assert len(xs) == 3 and xs[0] < LEFT + plot * 0.8, xs  # not squeezed into the last pixels of six hours
    assert "11:50" in svg and "12:00" in svg and "06:00" not in svg
    assert "last 10 min" in svg


def test_an_old_subscription_keeps_its_window_and_round_labels():
    points = [Point(NOW - dt.timedelta(minutes=10 * n), 5, 1.0, n) for n in range(40)]
    assert span_of(points, [], NOW, SIX_HOURS) == SIX_HOURS
    labels = re.findall(r">(\d\d:\d\d)</text>", render(points, [], NOW, SIX_HOURS))
    assert labels[-1] == "12:00" and len(labels) <= 7 and all(t.endswith(":00") for t in labels), labels
    assert span_of([], [], NOW, SIX_HOURS) == SIX_HOURS  # nothing yet: the window, and says so
    assert "no batch in the last 6 h" in render([], [], NOW, SIX_HOURS)
