"""publisher/pgoutput_columns.py: many INSERT/UPDATE/DELETE messages decoded at once, as columns, equal
to each decoded alone by core/pgoutput.py (hand-built bytes, tests/pgoutput_messages.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_rowfilter.core.pgoutput import (
    Delete,
    Insert,
    TupleData,
    TupleKind,
    Update,
    decode_message,
)
from airflow_provider_rowfilter.publisher.pgoutput_columns import Irregular, decode_changes, message_buffer
from tests.pgoutput_messages import EDGE_CASES, encode, oid_, tuples

# --- many change messages at once (publisher/pgoutput_columns.py) -------------------------------------------

_text_tuples = tuples().filter(lambda t: not any(isinstance(v, bytes) for v in t.values))
_changes = st.one_of(
    st.builds(Insert, oid_, _text_tuples),
    st.builds(Update, oid_, st.none(), st.none(), _text_tuples),
    st.builds(Update, oid_, st.sampled_from([TupleKind.KEY, TupleKind.OLD]), _text_tuples, _text_tuples),
    st.builds(Delete, oid_, st.sampled_from([TupleKind.KEY, TupleKind.OLD]), _text_tuples),
)


def _columns(messages: list[bytes]):
    buffer, starts, ends = message_buffer(messages)
    return buffer, decode_changes(buffer, starts, ends)


def _image_at(buffer, images, i):
    """Image ``i`` of decode_changes' output, as decode_message(raw_text=True) gives it."""
    if not images.present[i]:
        return None
    cells = range(images.offsets[i], images.offsets[i + 1])
    return TupleData(
        tuple(bytes(buffer[images.starts[c]:images.starts[c] + images.lengths[c]]) if images.kinds[c] == ord("t")
              else None for c in cells),
        tuple(bool(images.kinds[c] == ord("u")) for c in cells))


@given(st.lists(_changes, max_size=25))
def test_changes_decoded_together_equal_each_decoded_alone(messages):
    raw = [encode(m) for m in messages]
    buffer, columns = _columns(raw)
    for i, data in enumerate(raw):
        alone = decode_message(data, raw_text=True)
        assert columns.relation_oid[i] == alone.relation_oid
        old_kind = getattr(alone, "old_kind", None)
        assert columns.old_kind[i] == (-1 if old_kind is None else "KO".index(old_kind.value))
        assert _image_at(buffer, columns.new, i) == getattr(alone, "new", None)
        assert _image_at(buffer, columns.old, i) == getattr(alone, "old", None)


@given(st.lists(_changes, min_size=1, max_size=5), st.data())
def test_a_cut_or_padded_change_among_others_is_irregular(messages, data):
    raw = [encode(m) for m in messages]
    i = data.draw(st.integers(0, len(raw) - 1))
    cut = data.draw(st.integers(0, len(raw[i]) - 1))
    for bad in (raw[i][:cut], raw[i] + b"\x00"):
        with pytest.raises(Irregular):
            _columns([*raw[:i], bad, *raw[i + 1:]])


@pytest.mark.parametrize("data", [
    encode(EDGE_CASES["insert-binary-value"]),
    encode(EDGE_CASES["begin"]),
    b"I\x00\x00\x40\x10N\x00\x01x",
    b"I\x00\x00\x40\x10N\x00\x01t\xff\xff\xff\xff",
    b"I\x00\x00\x40\x10K\x00\x00",
    b"U\x00\x00\x40\x10K\x00\x00X\x00\x00",
], ids=["binary-value", "not-a-change", "unknown-column-kind", "negative-length", "insert-without-new",
        "update-without-new-after-old"])
def test_what_decode_changes_does_not_know_is_irregular(data):
    good = encode(EDGE_CASES["old-full-row"])
    with pytest.raises(Irregular):
        _columns([good, data, good])
