"""Types of the C extension publisher/_pgoutput_native.c (its docstrings say what each returns)."""

from typing_extensions import Buffer

_Image = tuple[int, int, bytes, bytes, bytes, bytes, bytes, bytes, int]

def join_rows(rows: list[tuple[int, bytes]], padding: int, /) -> tuple[bytes, bytes, bytes, bytes] | None: ...
def decode_changes(buffer: Buffer, starts: Buffer, ends: Buffer, /) -> tuple[bytes, bytes, _Image, _Image] | None: ...
