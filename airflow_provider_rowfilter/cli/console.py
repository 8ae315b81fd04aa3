"""Where the ``rowfilter`` command prints.

Everything printed that comes from data (names, keys, errors, SQL) is printed as it is: the consoles
do not read Rich markup, and styles are given as :class:`rich.text.Text` styles (:func:`say`).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

# markup=False: a "[/x]" in a key or "[p1, …]" in a hint is text, never a style tag.
console = Console(markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False)

#: ``rowfilter status`` ran and found the subscription broken (its slot gone or invalidated).
EXIT_BROKEN = 3


def say(*parts: str | tuple[str, str], err: bool = False) -> None:
    """Print one line: plain strings as they are, ``(text, style)`` pairs styled; never wrapped mid-line."""
    (err_console if err else console).print(Text.assemble(*parts), soft_wrap=True)
