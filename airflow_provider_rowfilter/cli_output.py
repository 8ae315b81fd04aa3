"""How the ``rowfilter`` command prints a table: one function, three formats (``--format``).

- ``table`` (the default on a terminal): a Rich table as wide as the terminal. A column marked
  ``whole`` (an LSN, a table name) is never wrapped nor cut; when the table cannot fit the terminal
  that way, each row is printed as a record, one field a line (psql's ``\\x auto``).
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
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "tsv", "json")
Cell = str | Text


@dataclass(frozen=True)
class Column:
    name: str
    #: never wrapped nor cut (an LSN, a name): copied whole from the terminal.
    whole: bool = False


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
        for line in ([c.name for c in columns], *([_plain(cell) for cell in row] for row in rows)):
            console.file.write("\t".join(_escape(value) for value in line) + "\n")
        return
    for line in title:  # on a terminal wrapped between words (an LSN is one), else one line as it is
        if fmt == "plain":
            console.file.write(_plain(line) + "\n")
        else:
            console.print(line, highlight=False)
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
    else:
        _print_expanded(console, columns, rows)


#: The narrowest a wrapped column is made in a table; narrower, the rows are printed one field a line.
READABLE = 16


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
