"""The C decoder (publisher/_pgoutput_native.c) on hostile input: a corrupt or crafted message, a bad argument.

Found in review: a negative ``padding`` made ``join_rows`` copy the rows past the end of its buffer (the
process died), and an LSN past 2^63 raised in C where the Python join decides. Now the C decoder reads
nothing outside what it was given, refuses what is not bytes-like with TypeError, and on every crafted
message below says what the numpy decoder says: the same arrays, or :class:`Irregular`.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from airflow_provider_rowfilter.publisher import pgoutput_columns
from airflow_provider_rowfilter.publisher.pgoutput_columns import Irregular, join_rows, message_buffer
from tests.pgoutput_messages import EDGE_CASES, encode
from tests.publisher.decoders import both_decoders

pytestmark = pytest.mark.skipif(pgoutput_columns._native is None, reason="the C decoder is not built (no C compiler)")

GOOD = encode(EDGE_CASES["old-full-row"])
#: An INSERT of relation 0x4010 up to its new tuple's column count (what follows is each case's).
INSERT = b"I\x00\x00\x40\x10N"

CRAFTED = {
    "negative-length": INSERT + b"\x00\x01t\xff\xff\xff\xff",
    "negative-length-with-bytes-after": INSERT + b"\x00\x01t\x80\x00\x00\x00" + b"x" * 64,
    "length-past-the-message": INSERT + b"\x00\x01t\x7f\xff\xff\xff" + b"x" * 8,
    "length-one-past-the-message": INSERT + b"\x00\x01t\x00\x00\x00\x04abc",
    "length-cut-in-its-middle": INSERT + b"\x00\x01t\x00\x00",
    "column-count-past-the-message": INSERT + b"\xff\xffn",
    "column-count-cut": INSERT + b"\x00",
    "odd-count-and-no-columns": INSERT + b"\x00\x03nn",
    "old-tuple-past-the-message": b"U\x00\x00\x40\x10O\x00\x02t\x00\x00\x00\x09ab",
    "delete-with-bytes-after-its-tuple": b"D\x00\x00\x40\x10K\x00\x01nXYZ",
    "shortest-change": INSERT + b"\x00",
    "empty-text-values": INSERT + b"\x00\x02t\x00\x00\x00\x00t\x00\x00\x00\x00",
}


@pytest.mark.parametrize("data", CRAFTED.values(), ids=CRAFTED.keys())
@pytest.mark.parametrize("where", ["alone", "among-others", "last"])
def test_a_crafted_message_gets_the_numpy_decoder_s_answer(data, where):
    raw = {"alone": [data], "among-others": [GOOD, data, GOOD], "last": [GOOD, data]}[where]
    native, numpy = both_decoders(raw)
    assert native == numpy
    if data not in (CRAFTED["empty-text-values"],):
        assert native == "irregular"


def test_the_buffer_s_end_is_the_message_s_end_without_padding():
    """A message at the very end of a buffer without the numpy decoder's padding: the C decoder reads nothing past it."""
    for data in CRAFTED.values():
        tight = np.frombuffer(data, np.uint8)
        with pytest.raises(Irregular) if data != CRAFTED["empty-text-values"] else nullcontext():
            pgoutput_columns.decode_changes_native(tight, np.array([0]), np.array([len(data)]))


@pytest.mark.parametrize("starts, ends", [([-1], [3]), ([2], [1]), ([0], [10**6]), ([0, 0], [1])],
                         ids=["negative-start", "end-before-start", "end-past-the-buffer", "lengths-differ"])
def test_bounds_outside_the_buffer_are_refused(starts, ends):
    buffer, _, _ = message_buffer([GOOD])
    with pytest.raises(ValueError, match="decode_changes"):
        pgoutput_columns._native.decode_changes(buffer, np.array(starts, np.int64), np.array(ends, np.int64))


def test_bounds_that_are_not_whole_int64s_are_refused_and_unaligned_ones_read():
    buffer, starts, ends = message_buffer([GOOD, GOOD])
    with pytest.raises(ValueError, match="int64 buffers"):
        pgoutput_columns._native.decode_changes(buffer, starts.tobytes()[:-1], ends.tobytes()[:-1])
    odd = bytearray(1 + 16)
    odd[1:] = starts.tobytes()
    unaligned = memoryview(odd)[1:]
    aligned = pgoutput_columns._native.decode_changes(buffer, starts, ends)
    assert pgoutput_columns._native.decode_changes(buffer, unaligned, ends) == aligned


@pytest.mark.parametrize("bad", ["I\x00\x00@\x10N\x00\x00", None, 7, ["a"], object()],
                         ids=["str", "none", "int", "list", "object"])
def test_what_is_not_bytes_like_is_a_type_error(bad):
    buffer, starts, ends = message_buffer([GOOD])
    native = pgoutput_columns._native
    for args in ((bad, starts, ends), (buffer, bad, ends), (buffer, starts, bad)):
        with pytest.raises(TypeError):
            native.decode_changes(*args)


def test_a_negative_padding_is_refused():
    with pytest.raises(ValueError, match="padding"):
        pgoutput_columns._native.join_rows([(1, b"ab"), (2, b"cdef")], -3)
    with pytest.raises(TypeError):
        pgoutput_columns._native.join_rows("ab", 8)


@pytest.mark.parametrize("lsn", [2**63, 2**64 - 1, 2**64, -1, 0, 2**63 - 1])
def test_an_lsn_past_int64_is_joined_as_the_python_join_does(lsn, monkeypatch):
    rows = [(1, b"ab"), (lsn, b"c")]

    def outcome():
        try:
            buffer, lsns, starts, ends = join_rows(rows)
        except Exception as e:  # whatever the Python join raises, the C one must raise too
            return type(e), str(e)
        return buffer.tobytes(), lsns.tolist(), starts.tolist(), ends.tolist()

    if not -(2**63) <= lsn < 2**63:
        assert pgoutput_columns._native.join_rows(rows, 8) is None  # left to the Python join
    with_c = outcome()
    monkeypatch.setattr(pgoutput_columns, "_native", None)
    assert with_c == outcome()

