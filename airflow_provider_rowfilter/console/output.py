"""How the ``rowfilter`` command prints a table: one function, three formats (``--format``).

- ``table`` (the default on a terminal): a Rich table as wide as the terminal. A column marked
  ``whole`` (an LSN, a table name) is never wrapped nor cut. When the table cannot fit the terminal
  that way, the columns marked ``detail`` leave the table and go, as ``name: value`` lines, under their
  row (a terminal of 80 columns keeps one line per table and its details beneath); when even that
  does not fit, each row is printed as a record, one field a line (psql's ``\\x auto``).
- ``plain`` (the default when stdout is not a terminal: a pipe, a file): the rows as aligned text,
  no box drawing, no colour, each row on one line whatever its width.
- ``tsv``: a header line and one line per row, tab-separated; a tab, newline or backslash in a value
  is written ``\\t``, ``\\n``, ``\\\\`` (PostgreSQL's ``COPY … (FORMAT text)`` escapes).

``json`` is each command's own document (``status --json``'s contract: docs/operations.md), printed by
the command, not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "tsv", "json")
Cell = str | Text


@dataclass(frozen=True)
class Column:
    name: str
    #: never wrapped nor cut (an LSN, a name): copied whole from the terminal.
    whole: bool = False
    #: may leave a table too wide for the terminal, for a line under its row.
    detail: bool = False


def output_format(requested: str | None, console: Console, *, as_json: bool = False) -> str:
    """The format to print in: ``--format``, ``--json``, else ``table`` on a terminal and ``plain`` elsewhere."""
    if as_json:
        return "json"
    if requested:
        return requested
    return "table" if console.is_terminal else "plain"


def print_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, fmt: str,
                title: Sequence[Cell] = (), show_lines: bool = False) -> None:
    """Print ``rows`` under ``columns`` in ``fmt`` (``table``, ``plain`` or ``tsv``), after the ``title`` lines
    (not in ``tsv``: its output is the header and the rows only)."""
    if fmt == "tsv":
        for values in ([c.name for c in columns], *([_plain(cell) for cell in row] for row in rows)):
            console.file.write("\t".join(_escape(value) for value in values) + "\n")
        return
    for heading in title:  # on a terminal wrapped between words (an LSN is one), else one line as it is
        if fmt == "plain":
            console.file.write(_plain(heading) + "\n")
        else:
            console.print(heading, highlight=False)
    if fmt == "plain":
        lines = [[c.name for c in columns], *([" ".join(_plain(cell).split("\n")) for cell in row] for row in rows)]
        widths = [max(cell_len(line[i]) for line in lines) for i in range(len(columns))]  # a CJK character is 2
        for line in lines:
            console.file.write("  ".join(v + " " * (w - cell_len(v)) for v, w in zip(line, widths, strict=True))
                               .rstrip() + "\n")
        return
    table = Table(box=box.SIMPLE_HEAD, show_lines=show_lines, pad_edge=False)
    for i, c in enumerate(columns):
        longest = max((cell_len(_plain(row[i])) for row in rows), default=0)
        table.add_column(c.name, no_wrap=c.whole, overflow="ignore" if c.whole else "fold",
                         min_width=None if c.whole else min(longest, READABLE))
    for row in rows:
        table.add_row(*row)
    need = table.__rich_measure__(console, console.options.update_width(1 << 16)).minimum
    if need <= console.width:
        console.print(table)
    elif not _print_with_details(console, columns, rows):
        _print_expanded(console, columns, rows)


#: The narrowest a wrapped column is made in a table; narrower, the rows are printed one field a line.
READABLE = 16


def _print_with_details(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> bool:
    """The columns not marked ``detail`` as a table, one line a row, each row's non-empty details under it as
    ``name: value`` lines indented and wrapped; False (nothing printed) when even those columns do not fit."""
    core = [i for i, c in enumerate(columns) if not c.detail]
    if len(core) == len(columns):
        return False
    texts = [[cell if isinstance(cell, Text) else Text(str(cell)) for cell in row] for row in rows]
    widths = [max([cell_len(columns[i].name), *(cell_len(t[i].plain) for t in texts)]) for i in core]
    if sum(widths) + 2 * (len(core) - 1) > console.width:
        return False
    shared = [i for i, c in enumerate(columns) if c.detail and len({t[i].plain for t in texts}) == 1
              and texts and texts[0][i].plain.strip()]
    for i in shared:  # the same for every row (the filtering mode, mostly): said once, above
        console.print(Text.assemble((columns[i].name + ": ", "dim"), texts[0][i]), soft_wrap=True)
    gap = "  "
    console.print(Text(gap.join(columns[i].name.ljust(w) for i, w in zip(core, widths, strict=True)).rstrip(),
                       style="bold"), soft_wrap=True)
    for row in texts:
        line = Text()
        for n, (i, w) in enumerate(zip(core, widths, strict=True)):
            line.append_text(row[i])
            if n < len(core) - 1:
                line.append(" " * (w - cell_len(row[i].plain)) + gap)
        console.print(line, soft_wrap=True, crop=False)
        for i, c in enumerate(columns):
            if c.detail and i not in shared and row[i].plain.strip():
                detail = Text.assemble((c.name + ": ", "dim"), row[i])
                console.print(Padding(detail, (0, 0, 0, 2)), overflow="fold")  # wrapped lines keep the indent
    return True


def _print_expanded(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
    """One field a line, a record at a time (psql's ``\\x auto``): for a terminal too narrow for the table."""
    for n, row in enumerate(rows, 1):
        console.print(Text(f"-[ RECORD {n} ]" + "-" * max(console.width - 14 - len(str(n)), 0), style="dim"),
                      soft_wrap=True)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(overflow="fold")
        for c, cell in zip(columns, row, strict=True):
            value = cell if isinstance(cell, Text) else Text(str(cell))
            if c.whole:
                value.no_wrap, value.overflow = True, "ignore"
            grid.add_row(c.name, value)
        console.print(grid, crop=False)


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
