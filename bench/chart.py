"""Draw docs/benchmarks.svg from the JSON lines the benchmarks print (``--json``): ours beside native.

    python bench/snapshot_copy.py --json | tail -1 > snapshot.json
    python bench/apply.py --json | tail -1 > apply.json
    python bench/chart.py snapshot.json apply.json > docs/benchmarks.svg

Plain SVG, no plotting library: two panels (initial copy in rows/s, apply in changes/s), each with
native and ours as bars on a linear scale, and the ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, PANEL, HEIGHT, BAR = 720, 340, 300, 90
COLOURS = {"native": "#4c72b0", "ours": "#dd8452"}


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot", type=Path, help="the JSON line of bench/snapshot_copy.py --json")
    p.add_argument("apply", type=Path, help="the JSON line of bench/apply.py --json")
    args = p.parse_args(argv)
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
