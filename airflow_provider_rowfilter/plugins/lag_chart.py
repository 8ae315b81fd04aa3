"""The Replication page's chart, drawn here as inline SVG: changes per batch and lag over the last hours.

Bars are the changes each batch applied (left axis), the line its lag behind the publisher when it
ran (seconds, right axis), red marks the failed runs of the incremental sync. Colours are the
page's theme (Chakra's CSS variables of Airflow's UI, light or dark), with fallbacks. Every value
is a number or a time this module formats: nothing from the data reaches the markup unescaped.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from airflow_provider_rowfilter.humane import duration

WIDTH, HEIGHT = 800, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 60, 30, 24
#: The widest it is drawn (a wide page keeps its text near 11 px: 800 units drawn at most 960 px wide).
MAX_WIDTH = 960
BARS = "var(--chakra-colors-info-solid, #2563eb)"
LINE = "var(--chakra-colors-warning-solid, #d97706)"
FAILED = "var(--chakra-colors-failed-solid, #dc2626)"
GRID = "var(--chakra-colors-border, #e4e4e7)"


@dataclass(frozen=True)
class Point:
    """One batch: when it finished, what it applied, how far behind it was (None: it captured nothing)."""

    at: dt.datetime
    changes: int
    lag_seconds: float | None
    batch_id: int


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at least ``value`` (an axis' top); 1 for nothing."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


#: The shortest span the time axis shows (a subscription's first minutes are not one bar across the chart).
MIN_SPAN = 10 * 60.0
#: Time-axis steps, seconds: the first that puts at most MAX_TICKS labels on the span.
TICK_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)
MAX_TICKS = 7


def span_of(points: Sequence[Point], failures: Sequence[dt.datetime], now: dt.datetime, window_seconds: float) -> float:
    """Seconds the time axis covers: from the oldest batch or failed run of the window (a little before it) to
    ``now``, at least :data:`MIN_SPAN`, at most the window: a new subscription fills the chart, an old one shows
    its window."""
    start = now - dt.timedelta(seconds=window_seconds)
    times = [p.at for p in points if start <= p.at <= now] + [f for f in failures if start <= f <= now]
    if not times:
        return window_seconds
    covered = (now - min(times)).total_seconds() * 1.05
    return min(window_seconds, max(MIN_SPAN, covered))


def render(points: Sequence[Point], failures: Sequence[dt.datetime], now: dt.datetime, window_seconds: float) -> str:
    """The SVG of the last ``window_seconds`` up to ``now`` (times in UTC), its time axis fitted to the data."""
    window_seconds = span_of(points, failures, now, window_seconds)
    start = now - dt.timedelta(seconds=window_seconds)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: dt.datetime) -> float:
        return LEFT + plot_w * min(max((at - start).total_seconds() / window_seconds, 0.0), 1.0)

    shown = [p for p in points if start <= p.at <= now]
    top_changes = nice_ceiling(max((p.changes for p in shown), default=0))
    top_lag = nice_ceiling(max((p.lag_seconds or 0.0 for p in shown), default=0.0))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
           f'data-testid="rowfilter-chart" font-size="11" font-family="inherit" fill="currentColor" '
           f'style="max-width: {MAX_WIDTH}px; font-size: 11px">',
           f"<title>Changes per batch and lag over the last {escape(duration(window_seconds))}</title>"]
    for i in range(5):  # horizontal grid and both axes' labels
        y = TOP + plot_h * i / 4
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_count(top_changes * (4 - i) / 4)}</text>')
        out.append(f'<text x="{LEFT + plot_w + 6}" y="{y + 4:.1f}">{escape(_seconds(top_lag * (4 - i) / 4))}</text>')
    step = next((t for t in TICK_STEPS if window_seconds / t <= MAX_TICKS), TICK_STEPS[-1])
    first = dt.datetime.fromtimestamp(math.ceil(start.timestamp() / step) * step, dt.timezone.utc)
    at = first
    while at <= now:  # time labels on round times, UTC
        out.append(f'<text x="{x(at):.1f}" y="{HEIGHT - 8}" text-anchor="middle">{at:%H:%M}</text>')
        at += dt.timedelta(seconds=step)
    width = max(2.0, min(8.0, plot_w / max(len(shown), 1) * 0.6))
    for p in shown:
        h = plot_h * p.changes / top_changes
        lag = "nothing captured" if p.lag_seconds is None else f"{duration(p.lag_seconds)} behind"
        out.append(f'<rect x="{x(p.at) - width / 2:.1f}" y="{TOP + plot_h - h:.1f}" width="{width:.1f}" '
                   f'height="{max(h, 0.0):.1f}" fill="{BARS}"><title>batch {p.batch_id} at {p.at:%H:%M:%S} UTC: '
                   f"{p.changes:,} changes, {escape(lag)}</title></rect>")
    lagged = [p for p in shown if p.lag_seconds is not None]
    if lagged:
        path = " ".join(f"{x(p.at):.1f},{TOP + plot_h - plot_h * (p.lag_seconds or 0) / top_lag:.1f}" for p in lagged)
        out.append(f'<polyline points="{path}" fill="none" stroke="{LINE}" stroke-width="2"/>')
        for p in lagged:
            out.append(f'<circle cx="{x(p.at):.1f}" cy="{TOP + plot_h - plot_h * (p.lag_seconds or 0) / top_lag:.1f}" '
                       f'r="2.5" fill="{LINE}"/>')
    for at in failures:
        if start <= at <= now:
            cx = x(at)
            out.append(f'<path d="M{cx - 5:.1f},{TOP + plot_h + 1} L{cx + 5:.1f},{TOP + plot_h + 1} L{cx:.1f},'
                       f'{TOP + plot_h - 8} Z" fill="{FAILED}"><title>failed run at {at:%H:%M:%S} UTC</title></path>')
    legend = [(BARS, "rect", "changes per batch"), (LINE, "line", "lag then (s)"), (FAILED, "path", "failed run")]
    lx = LEFT
    for colour, shape, label in legend:
        if shape == "rect":
            out.append(f'<rect x="{lx}" y="6" width="10" height="10" fill="{colour}"/>')
        elif shape == "line":
            out.append(f'<line x1="{lx}" x2="{lx + 12}" y1="11" y2="11" stroke="{colour}" stroke-width="2"/>')
        else:
            out.append(f'<path d="M{lx},16 L{lx + 10},16 L{lx + 5},7 Z" fill="{colour}"/>')
        out.append(f'<text x="{lx + 16}" y="15">{label}</text>')
        lx += 16 + round(6.2 * len(label)) + 22
    if not shown:
        out.append(f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle">'
                   f"no batch in the last {escape(duration(window_seconds))}</text>")
    out.append("</svg>")
    return "".join(out)


def _count(n: float) -> str:
    return f"{n:,.0f}" if n >= 10 or n == int(n) else f"{n:.1f}"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 or s == int(s) else f"{s:.2f}".rstrip("0").rstrip(".") + " s"
