"""Decode the row images of many pgoutput change messages at once, into columns (in C where built, else numpy).

:mod:`~airflow_provider_rowfilter.core.pgoutput` decodes one message into Python objects: the
reference, and what every message other than INSERT, UPDATE and DELETE goes through. Those three
are nearly all of a capture's messages, and decoding them value by value in Python was most of
the capture's time. Here a whole fetch of messages is one byte buffer, and each row image is
walked column by column for all messages together: one vectorised step per column position, not
per value. The result says where each value sits in the buffer; the change-log writer gathers the
bytes into Arrow arrays from that (publisher/image_arrays.py).

Anything unexpected (a column kind other than ``t``, ``n`` and ``u``, a tuple that does not end
where its message does, a missing ``N``/``K``/``O`` marker) raises :class:`Irregular`; the caller
then decodes the messages one by one with :func:`~airflow_provider_rowfilter.core.pgoutput.decode_message`,
which names the message and what is wrong with it.

The same decoding exists in C (``_pgoutput_native.c``, built by the package's install where a C
compiler is found): :func:`decode_changes` uses it when it is there, and it then gathers the values
into Arrow's buffers itself, without the GIL, so a capture running in a thread beside the apply
decodes while the apply's Python runs. Both give the same arrays (tests/publisher/test_pgoutput_columns.py);
``ROWFILTER_PGOUTPUT_DECODER=numpy`` in the environment makes a process use this module's numpy
decoder (to compare them), and :data:`DECODER` says which one a process uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from types import ModuleType

import numpy as np
import pyarrow as pa

_native: ModuleType | None  # the C extension (its types: _pgoutput_native.pyi), or None
try:
    from airflow_provider_rowfilter.publisher import _pgoutput_native as _native
except ImportError:  # installed where no C compiler was found: the numpy decoder does the same
    _native = None
if os.environ.get("ROWFILTER_PGOUTPUT_DECODER", "").lower() == "numpy":
    _native = None
#: "native" (the C extension) or "numpy": how this process decodes a fetch's changes.
DECODER = "numpy" if _native is None else "native"

INSERT, UPDATE, DELETE = ord("I"), ord("U"), ord("D")
BEGIN, COMMIT = ord("B"), ord("C")
#: A Begin message's bytes: its kind, final_lsn (8), commit time (8), xid (4); a Commit's: its kind,
#: flags (1), commit_lsn (8), end_lsn (8), commit time (8) (core/pgoutput.py ``_begin``, ``_commit``).
BEGIN_SIZE, COMMIT_SIZE = 21, 26
_NEW, _KEY, _OLD = ord("N"), ord("K"), ord("O")
TEXT, NULL, UNCHANGED = ord("t"), ord("n"), ord("u")
#: Bytes after the buffer's end, so a malformed message's reads past its end stay inside the array.
PADDING = 8


class Irregular(Exception):  # a signal to fall back, not an error shown to anyone
    """The messages are not the regular INSERT/UPDATE/DELETE this module decodes."""


@dataclass(frozen=True)
class ImageCells:
    """One row image (new, or old) per message, as cells located in the message buffer, flattened as
    Arrow lays out a list column (publisher/image_arrays.py ``image_arrays`` gathers their bytes).

    Image ``i`` holds cells ``offsets[i]:offsets[i + 1]`` (none when ``present[i]`` is false). A
    cell is a column kind (``t``, ``n``, ``u``) and, for ``t``, where its bytes are in the buffer.
    """

    present: np.ndarray  # bool, per message
    offsets: np.ndarray  # int64, per message + 1
    kinds: np.ndarray  # uint8, per cell
    starts: np.ndarray  # int64, per cell
    lengths: np.ndarray  # int64, per cell (0 unless kind is t)

    def placed(self, where: np.ndarray, total: int) -> ImageCells:
        """These images as those of rows ``where`` (ascending) among ``total`` rows, absent elsewhere."""
        return replace(self, **_placed(self.present, self.offsets, where, total))


@dataclass(frozen=True)
class GatheredImages:
    """:class:`ImageCells` whose values the C decoder already gathered into Arrow arrays: image ``i``
    holds elements ``offsets[i]:offsets[i + 1]`` of ``values`` (binary, NULL unless sent as text) and of
    ``unchanged`` (bool)."""

    present: np.ndarray  # bool, per message
    offsets: np.ndarray  # int64, per message + 1
    values: pa.Array
    unchanged: pa.Array

    def placed(self, where: np.ndarray, total: int) -> GatheredImages:
        """These images as those of rows ``where`` (ascending) among ``total`` rows, absent elsewhere."""
        return replace(self, **_placed(self.present, self.offsets, where, total))


def _placed(present: np.ndarray, offsets: np.ndarray, where: np.ndarray, total: int) -> dict[str, np.ndarray]:
    """``present`` and ``offsets`` of images moved to rows ``where`` among ``total`` (the cells stay)."""
    placed = np.zeros(total, bool)
    placed[where] = present
    counts = np.zeros(total, np.int64)
    counts[where] = np.diff(offsets)
    moved = np.zeros(total + 1, np.int64)
    np.cumsum(counts, out=moved[1:])
    return {"present": placed, "offsets": moved}


@dataclass(frozen=True)
class Bounds:
    """The Begin and Commit messages of a fetch, decoded together (for each, in slot order)."""

    final_lsn: np.ndarray  # int64, per Begin: the LSN of the transaction's commit record
    begin_ts: np.ndarray  # int64, per Begin: the commit time, microseconds since 2000-01-01
    xid: np.ndarray  # int64, per Begin
    commit_lsn: np.ndarray  # int64, per Commit
    end_lsn: np.ndarray  # int64, per Commit
    commit_ts: np.ndarray  # int64, per Commit


def decode_bounds(buffer: np.ndarray, begins: np.ndarray, commits: np.ndarray) -> Bounds:
    """The Begin messages starting at ``begins`` and the Commit messages at ``commits`` (each of its size).

    :raises Irregular: an LSN past what an int64 holds (none is, in practice; the caller decodes one by one).
    """
    final_lsn, commit_lsn, end_lsn = (_uint(buffer, at, 8) for at in (begins + 1, commits + 2, commits + 10))
    if any((lsn >= 1 << 63).any() for lsn in (final_lsn, commit_lsn, end_lsn)):
        raise Irregular("an LSN past 2^63")
    return Bounds(final_lsn.astype(np.int64), _uint(buffer, begins + 9, 8).view(np.int64),
                  _uint(buffer, begins + 17, 4).astype(np.int64), commit_lsn.astype(np.int64),
                  end_lsn.astype(np.int64), _uint(buffer, commits + 18, 8).view(np.int64))


@dataclass(frozen=True)
class ChangeColumns:
    """The INSERT/UPDATE/DELETE messages of a buffer, decoded."""

    relation_oid: np.ndarray  # int64, per message
    old_kind: np.ndarray  # int8, per message: -1 none, 0 K (old key), 1 O (old full row)
    new: ImageCells | GatheredImages
    old: ImageCells | GatheredImages


def message_buffer(messages: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Join ``messages`` into one padded byte array; return it with each message's start and end."""
    lengths = np.fromiter(map(len, messages), np.int64, len(messages))
    ends = np.cumsum(lengths)
    buffer = np.frombuffer(b"".join(messages) + bytes(PADDING), np.uint8)
    return buffer, ends - lengths, ends


def join_rows(rows: list[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A fetch of slot rows ``(lsn, data)`` as :func:`message_buffer` joins their data, with each row's LSN:
    ``(buffer, lsns, starts, ends)``. In C where the extension is built (no Python object per row)."""
    # The C join leaves to this one what it does not take: rows of another shape, an LSN past int64.
    joined = None if _native is None or not isinstance(rows, list) else _native.join_rows(rows, PADDING)
    if joined is None:
        buffer, starts, ends = message_buffer([r[1] for r in rows])
        return buffer, np.fromiter((r[0] for r in rows), np.int64, len(rows)), starts, ends
    buffer, lsns, starts, ends = joined
    return (np.frombuffer(buffer, np.uint8), np.frombuffer(lsns, np.int64), np.frombuffer(starts, np.int64),
            np.frombuffer(ends, np.int64))


def _uint(buffer: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The big-endian unsigned ``width``-byte integers at ``at``, as uint64."""
    value = np.zeros(len(at), np.uint64)
    for i in range(width):
        value = (value << np.uint64(8)) | buffer[at + i].astype(np.uint64)
    return value


def _uint32(buffer: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian unsigned 32-bit integers at ``at``."""
    return _uint(buffer, at, 4).astype(np.int64)


def _int32(buffer: np.ndarray, at: np.ndarray) -> np.ndarray:
    value = _uint32(buffer, at)
    return np.where(value >= 1 << 31, value - (1 << 32), value)


def _tuples(buffer: np.ndarray, starts: np.ndarray, limits: np.ndarray) -> tuple[ImageCells, np.ndarray]:
    """Walk the TupleData at each of ``starts`` (none beyond ``limits``); return the cells and where each ends."""
    size = len(buffer) - PADDING
    at = starts + 2
    if len(starts) and at.max() > size:
        raise Irregular("a tuple header runs past the buffer")
    counts = (buffer[starts].astype(np.int64) << 8) | buffer[starts + 1]
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    width = int(counts.max()) if len(counts) else 0
    kinds = np.zeros((len(starts), width), np.uint8)
    value_starts = np.zeros((len(starts), width), np.int64)
    lengths = np.zeros((len(starts), width), np.int64)
    for j in range(width):
        rows = np.flatnonzero(counts > j)
        here = at[rows]
        if (here >= np.minimum(limits[rows], size)).any():
            raise Irregular("a tuple runs past its message")
        kind = buffer[here]
        text = kind == TEXT
        if not (text | (kind == NULL) | (kind == UNCHANGED)).all():
            raise Irregular("a column kind other than t, n, u")
        length = np.where(text, _int32(buffer, np.minimum(here + 1, size)), 0)
        if (length < 0).any():
            raise Irregular("a negative value length")
        kinds[rows, j] = kind
        value_starts[rows, j] = here + 5
        lengths[rows, j] = length
        at[rows] = here + np.where(text, 5 + length, 1)
    if (at > limits).any():
        raise Irregular("a tuple runs past its message")
    cells = np.arange(width) < counts[:, None]
    return ImageCells(np.ones(len(starts), bool), offsets, kinds[cells], value_starts[cells], lengths[cells]), at


def decode_changes(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> ChangeColumns:
    """Decode the INSERT, UPDATE and DELETE messages at ``starts``/``ends`` of ``buffer``: in C without
    the GIL when the extension is built (:data:`DECODER`), else with numpy (:func:`decode_changes_numpy`).

    :raises Irregular: a message is not a well-formed INSERT/UPDATE/DELETE of text values.
    """
    if _native is None:
        return decode_changes_numpy(buffer, starts, ends)
    return decode_changes_native(buffer, starts, ends)


def decode_changes_native(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> ChangeColumns:
    """:func:`decode_changes_numpy`'s result from the C decoder, the values gathered into Arrow arrays."""
    if _native is None:
        raise RuntimeError("the C decoder (publisher/_pgoutput_native) is not built in this installation")
    decoded = _native.decode_changes(buffer, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(ends, np.int64))
    if decoded is None:
        raise Irregular("not the regular INSERT/UPDATE/DELETE messages of text values the C decoder reads")
    oids, old_kind, new, old = decoded
    return ChangeColumns(np.frombuffer(oids, np.int64), np.frombuffer(old_kind, np.int8), _gathered(new, len(starts)),
                         _gathered(old, len(starts)))


def _gathered(image: tuple, n: int) -> GatheredImages:
    """The C decoder's buffers of one image (_pgoutput_native.c ``image_tuple``) as arrays."""
    cells, _absent, list_valid, list_offsets, valid, offsets, data, unchanged, large = image
    values = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), cells,
                                   [pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)])
    present = np.unpackbits(np.frombuffer(list_valid, np.uint8), count=n, bitorder="little").astype(bool)
    return GatheredImages(present, np.frombuffer(list_offsets, np.int32).astype(np.int64), values,
                          pa.Array.from_buffers(pa.bool_(), cells, [None, pa.py_buffer(unchanged)]))


def decode_changes_numpy(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> ChangeColumns:
    """Decode the INSERT, UPDATE and DELETE messages at ``starts``/``ends`` of ``buffer`` with numpy.

    :raises Irregular: a message is not a well-formed INSERT/UPDATE/DELETE of text values.
    """
    n = len(starts)
    if n == 0:
        empty = ImageCells(np.zeros(0, bool), np.zeros(1, np.int64), np.zeros(0, np.uint8), np.zeros(0, np.int64),
                       np.zeros(0, np.int64))
        return ChangeColumns(np.zeros(0, np.int64), np.zeros(0, np.int8), empty, empty)
    if ((ends - starts) < 7).any():
        raise Irregular("a message too short for a change")
    kind = buffer[starts]
    marker = buffer[starts + 5]
    is_update, is_delete = kind == UPDATE, kind == DELETE
    has_old = (marker == _KEY) | (marker == _OLD)
    if not ((kind == INSERT) | is_update | is_delete).all():
        raise Irregular("not an INSERT, UPDATE or DELETE")
    if (is_delete & ~has_old).any() or (~is_delete & ~has_old & (marker != _NEW)).any() or \
            (kind == INSERT)[has_old].any():
        raise Irregular("a tuple marker out of place")
    old_at = np.flatnonzero(has_old)
    old, old_end = _tuples(buffer, starts[old_at] + 6, ends[old_at])
    new_begins = starts + 6
    after_old = old_at[~is_delete[old_at]]
    ends_of_old = old_end[~is_delete[old_at]]
    if (buffer[np.minimum(ends_of_old, len(buffer) - 1)] != _NEW).any():
        raise Irregular("no N after an UPDATE's old tuple")
    new_begins[after_old] = ends_of_old + 1
    new_at = np.flatnonzero(~is_delete)
    new, new_end = _tuples(buffer, new_begins[new_at], ends[new_at])
    if (new_end != ends[new_at]).any() or (old_end[is_delete[old_at]] != ends[old_at][is_delete[old_at]]).any():
        raise Irregular("a message does not end where its last tuple does")
    old_kind = np.full(n, -1, np.int8)
    old_kind[old_at] = np.where(marker[old_at] == _OLD, 1, 0)
    return ChangeColumns(_uint32(buffer, starts + 1), old_kind, new.placed(new_at, n), old.placed(old_at, n))
