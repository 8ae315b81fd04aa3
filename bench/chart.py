"""Draw docs/benchmarks.svg from the JSON lines the benchmarks print (``--json``): ours beside native.

    python bench/snapshot_copy.py --json | tail -1 > snapshot.json
    python bench/apply.py --json | tail -1 > apply.json
    python bench/chart.py snapshot.json apply.json > docs/benchmarks.svg
    python bench/chart.py --keepup docs/bench/keepup.json > docs/benchmarks-keepup.svg

Plain SVG, no plotting library: two panels (initial copy in rows/s, apply in changes/s), each with
native and ours as bars on a linear scale, and the ratio. ``--keepup`` draws bench/keepup.py's
result instead: per phase, the lag in seconds of every subscription it sampled (ours, native,
pglogical) over time, ours also at the end of each scheduled run, with the two-interval line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, PANEL, HEIGHT, BAR = 720, 340, 300, 90
KEEPUP_PANEL = 240  # the height of one lag panel
COLOURS = {"native": "#4c72b0", "ours": "#dd8452", "pglogical": "#55a868"}


def panel(x0: int, title: str, unit: str, native: float, ours: float) -> list[str]:
    top, bottom = 60, HEIGHT - 40
    scale = (bottom - top) / max(native, ours)
    out = [f'<text x="{x0 + PANEL / 2}" y="24" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
           f'<text x="{x0 + PANEL / 2}" y="44" text-anchor="middle">ratio ours/native {ours / native:.2f}</text>',
           f'<line x1="{x0 + 20}" y1="{bottom}" x2="{x0 + PANEL - 20}" y2="{bottom}" stroke="#333"/>']
    for i, (name, value) in enumerate((("native", native), ("ours", ours))):
        x, h = x0 + 50 + i * (BAR + 60), value * scale
        out += [f'<rect x="{x}" y="{bottom - h:.1f}" width="{BAR}" height="{h:.1f}" fill="{COLOURS[name]}"/>',
                f'<text x="{x + BAR / 2}" y="{bottom - h - 6:.1f}" text-anchor="middle">{value:,.0f} {unit}</text>',
                f'<text x="{x + BAR / 2}" y="{bottom + 18}" text-anchor="middle">{name}</text>']
    return out


def lag_panel(y0: int, title: str, lines: dict[str, list[tuple[float, float]]], x_max: float, limit: float | None,
              unit: str, stop: float | None = None, marks: list[tuple[float, float]] = ()) -> list[str]:
    """One line chart: per subscription, ``lines`` of (seconds since pgbench started, value); ``marks``: ours
    at the end of each run; a dashed ``limit`` line, a dotted line where pgbench stopped (``stop``)."""
    left, right, top, bottom = 70, WIDTH - 20, y0 + 30, y0 + KEEPUP_PANEL - 30
    y_max = max([v for line in lines.values() for _, v in line] + [v for _, v in marks] + [limit or 0, 1e-9]) * 1.1

    def xy(t: float, v: float) -> str:
        return f"{left + t / x_max * (right - left):.1f},{bottom - v / y_max * (bottom - top):.1f}"
    out = [f'<text x="{WIDTH / 2}" y="{y0 + 18}" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>',
           f'<text x="{left - 6}" y="{top + 4}" text-anchor="end">{y_max:,.1f} {unit}</text>',
           f'<text x="{left - 6}" y="{bottom + 4}" text-anchor="end">0</text>',
           f'<text x="{left}" y="{bottom + 18}">0 s: pgbench starts</text>',
           f'<text x="{right}" y="{bottom + 18}" text-anchor="end">{x_max:,.0f} s</text>']
    if stop is not None and stop < x_max:  # pgbench stopped: the runs after it only drain
        x = left + stop / x_max * (right - left)
        out += [f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#999" stroke-dasharray="2,3"/>',
                f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle" fill="#666">{stop:,.0f} s: pgbench stops</text>']
    if limit is not None:
        out += [f'<polyline points="{xy(0, limit)} {xy(x_max, limit)}" stroke="#c44e52" stroke-dasharray="6,4" '
                'fill="none"/>',
                f'<text x="{right}" y="{bottom - limit / y_max * (bottom - top) - 6:.1f}" text-anchor="end" '
                f'fill="#c44e52">two intervals, {limit:,.0f} {unit}</text>']
    for name, points in lines.items():
        if points:
            out.append(f'<polyline points="{" ".join(xy(t, v) for t, v in points)}" stroke="{COLOURS[name]}" '
                       'stroke-width="2" fill="none"/>')
    out += [f'<circle cx="{xy(t, v).split(",")[0]}" cy="{xy(t, v).split(",")[1]}" r="3" '
            f'fill="{COLOURS["ours"]}"/>' for t, v in marks]
    return out



def keepup_chart(result: dict) -> list[str]:
    """bench/keepup.py's lag over time: one panel per phase (a fraction of the machine's rate), seconds behind
    the publisher's last commit for every subscription it sampled, ours also at the end of each run."""
    phases = result.get("phases") or [{"fraction": None, "pgbench_tps": result["pgbench_tps"], "runs": result["runs"],
                                       "samples": []}]
    head = (f"keep-up: pgbench -c {result['clients']} for {result['seconds']} s per phase, rowfilter apply every "
            f"{result['interval']:.0f} s" + (f"; the machine's rate {result['calibrated_tps']:,.0f} tps"
                                             if result.get("calibrated_tps") else ""))
    names = result.get("subscriptions") or ["ours"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{len(phases) * KEEPUP_PANEL + 50}" '
             'font-family="sans-serif" font-size="13">', '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{WIDTH / 2}" y="20" text-anchor="middle">{escape(head)}</text>']
    for i, name in enumerate(names):
        parts.append(f'<text x="{90 + i * 130}" y="40" fill="{COLOURS[name]}" font-weight="bold">— {name}</text>')
    for k, phase in enumerate(phases):
        runs, samples = phase["runs"], phase["samples"]
        lines = {name: [(x["t"], x[f"{name}_seconds"]) for x in samples if x.get(f"{name}_seconds") is not None]
                 for name in names}
        if not samples:
            lines["ours"] = [(r["end"], r["lag_seconds"]) for r in runs if r["lag_seconds"] is not None]
        x_max = max([result["seconds"]] + [r["end"] for r in runs] + [t for line in lines.values() for t, _ in line])
        share = "" if phase["fraction"] is None else f"{phase['fraction']:.0%} of the rate, "
        parts += lag_panel(45 + k * KEEPUP_PANEL, f"{share}{phase['pgbench_tps']:,.0f} tps: lag, seconds behind the "
                           "publisher's last commit", lines, x_max, 2 * result["interval"], "s", result["seconds"],
                           marks=[(r["end"], r["lag_seconds"]) for r in runs if r["lag_seconds"] is not None])
    parts.append("</svg>")
    return parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot", type=Path, nargs="?", help="the JSON line of bench/snapshot_copy.py --json")
    p.add_argument("apply", type=Path, nargs="?", help="the JSON line of bench/apply.py --json")
    p.add_argument("--keepup", type=Path, help="draw bench/keepup.py's JSON result instead")
    args = p.parse_args(argv)
    if args.keepup:
        print("\n".join(keepup_chart(json.loads(args.keepup.read_text()))))
        return 0
    if not (args.snapshot and args.apply):
        p.error("give the snapshot and apply JSON files, or --keepup FILE")
    snap, apply = (json.loads(path.read_text().strip().splitlines()[-1]) for path in (args.snapshot, args.apply))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             'font-family="sans-serif" font-size="13">', '<rect width="100%" height="100%" fill="white"/>']
    parts += panel(10, f"initial copy, {snap['rows_copied']:,} rows", "rows/s",
                   snap["native_rows_per_s"], snap["ours_rows_per_s"])
    parts += panel(10 + PANEL + 20, f"apply, {apply['changes']:,} changes", "changes/s",
                   apply["native_changes_per_s"], apply["ours_changes_per_s"])
    parts.append("</svg>")
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
