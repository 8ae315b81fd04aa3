"""publisher/pgoutput_columns.py: many INSERT/UPDATE/DELETE messages decoded at once, as columns, equal
to each decoded alone by core/pgoutput.py (hand-built bytes, tests/pgoutput_messages.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_rowfilter.core.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Origin,
    PgOutputError,
    RelationColumn,
    RelationMessage,
    Truncate,
    TupleData,
    TupleKind,
    Update,
    decode_message,
)
from airflow_provider_rowfilter.core.relation import ReplicaIdentity
from airflow_provider_rowfilter.publisher import pgoutput_columns
from airflow_provider_rowfilter.publisher.pgoutput_columns import (
    Irregular,
    decode_changes_native,
    decode_changes_numpy,
    join_rows,
    message_buffer,
)
from tests.pgoutput_messages import EDGE_CASES, encode, oid_, tuples
from tests.publisher.decoders import both_decoders

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
    return buffer, decode_changes_numpy(buffer, starts, ends)


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


# --- the C decoder (publisher/_pgoutput_native.c) against the numpy one ------------------------------------

native = pytest.mark.skipif(pgoutput_columns._native is None, reason="the C decoder is not built (no C compiler)")


def test_the_c_decoder_is_built_where_a_compiler_is():
    """`pip install -e .` builds it (setup.py); its absence here would silently cost the capture its speed."""
    import shutil
    import sysconfig

    if not shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc"):
        pytest.skip("no C compiler: the numpy decoder is the one installed")
    from airflow_provider_rowfilter.publisher import _pgoutput_native  # noqa: F401


@native
@settings(deadline=None)  # the first example imports the change log's pyarrow
@given(st.lists(_changes, max_size=25), st.lists(st.integers(0, 2000), max_size=3))
def test_the_c_decoder_equals_the_numpy_one_on_changes_and_on_damaged_ones(messages, damage):
    raw = [encode(m) for m in messages]
    native_out, numpy_out = both_decoders(raw)
    assert native_out == numpy_out
    if raw:
        # Cut, padded or with a byte changed: both call the same messages irregular, or decode them alike.
        i = damage[0] % len(raw) if damage else 0
        for bad in (raw[i][:len(raw[i]) // 2], raw[i] + b"t", raw[i][:-1] + bytes([sum(damage) % 256])):
            native_out, numpy_out = both_decoders([*raw[:i], bad, *raw[i + 1:]])
            assert native_out == numpy_out


@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.binary(max_size=40)), max_size=20))
def test_a_fetch_s_rows_are_joined_as_message_buffer_joins_them(rows):
    buffer, lsns, starts, ends = join_rows(rows)
    expected_buffer, expected_starts, expected_ends = message_buffer([data for _, data in rows])
    assert buffer.tobytes() == expected_buffer.tobytes()
    assert (lsns.tolist(), starts.tolist(), ends.tolist()) == (
        [lsn for lsn, _ in rows], expected_starts.tolist(), expected_ends.tolist())


@native
def test_rows_of_another_shape_are_joined_in_python():
    assert pgoutput_columns._native.join_rows([(1, memoryview(b"x"))], 8) is None
    buffer, lsns, starts, ends = join_rows([(1, b"ab"), (2, b"c")])
    assert (buffer.tobytes(), lsns.tolist()) == (b"abc" + bytes(8), [1, 2])


@native
@pytest.mark.parametrize("data", [
    encode(EDGE_CASES["insert-binary-value"]),
    encode(EDGE_CASES["begin"]),
    b"I\x00\x00\x40\x10N\x00\x01x",
    b"I\x00\x00\x40\x10N\x00\x01t\xff\xff\xff\xff",
    b"I\x00\x00\x40\x10K\x00\x00",
    b"U\x00\x00\x40\x10K\x00\x00X\x00\x00",
], ids=["binary-value", "not-a-change", "unknown-column-kind", "negative-length", "insert-without-new",
        "update-without-new-after-old"])
def test_what_the_c_decoder_does_not_know_is_irregular(data):
    good = encode(EDGE_CASES["old-full-row"])
    buffer, starts, ends = message_buffer([good, data, good])
    with pytest.raises(Irregular):
        decode_changes_native(buffer, starts, ends)


# --- the transactions' Begin and Commit of a fetch at once (publisher/change_reader.py ``_walk_transactions``) -----

_SLOT = st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["C", "", "R", "O", "T"])), min_size=1, max_size=12)


def _slot_rows(txns) -> list[tuple[int, bytes]]:
    """(lsn, message) of transactions of ``n`` INSERTs each, a Relation message, an Origin or a TRUNCATE
    (R, O, T) in some (the first announces the relation), and the last left open when it says "" (else C)."""
    rows, lsn = [], 1000
    txns = [(txns[0][0], "R"), *txns[1:]]
    for xid, (n, extra) in enumerate(txns, start=700):
        extra = extra or ("" if xid == 700 + len(txns) - 1 else "C")
        final = lsn + 100 * (n + 3)
        rows.append((lsn, encode(Begin(final, datetime(2026, 1, 2, 3, 4, 5, xid, tzinfo=timezone.utc), xid))))
        if extra == "R":
            rows.append((lsn, encode(RelationMessage(16400, "public", "t", ReplicaIdentity.DEFAULT,
                                                     (RelationColumn(True, "a", 23, -1),)))))
        if extra == "O":
            rows.append((lsn, encode(Origin(5, "upstream"))))
        for i in range(n):
            rows.append((lsn + 10 + i, encode(Insert(16400, TupleData((str(i),), (False,))))))
        if extra == "T":
            rows.append((lsn + 90, encode(Truncate((16400,), 0))))
        if extra != "":
            rows.append((final, encode(Commit(0, final, final + 8, datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc)))))
        lsn = final + 100
    return rows


def _walks(rows, cuts, columns: bool):
    from airflow_provider_rowfilter.publisher import change_reader

    reader = change_reader.ChangeReader(None, change_reader.TypeNames.__new__(change_reader.TypeNames), "utf-8")
    reader.types.announce = lambda message: None
    reader.types.logged = lambda message: message.oid
    if not columns:
        reader._walk_transactions = lambda fetch: None
    seen = []
    for part in np.split(np.arange(len(rows)), sorted(set(c % len(rows) for c in cuts))):
        if not len(part):
            continue
        fetched = [rows[i] for i in part]
        buffer, starts, ends = message_buffer([m for _, m in fetched])
        fetch = change_reader.Fetch([m for _, m in fetched], np.array([lsn for lsn, _ in fetched], np.int64), buffer,
                                     starts, ends)
        walk = reader._walk(fetch)
        seen.append((walk.txns, walk.runs, walk.truncates, walk.announced, walk.transactions, reader.txn, reader.seq,
                     reader.batch.end_lsn, reader.batch.last_commit_ts))
    return seen


@settings(deadline=None)  # the first example imports the capture
@given(_SLOT, st.lists(st.integers(1, 60), max_size=4))
def test_a_fetch_s_transactions_read_together_are_what_each_message_read_alone_says(txns, cuts):
    rows = _slot_rows(txns)
    assert _walks(rows, cuts, columns=True) == _walks(rows, cuts, columns=False)


def test_a_commit_that_closes_another_transaction_is_left_to_the_message_by_message_walk():
    rows = _slot_rows([(1, "C")])
    rows[-1] = (rows[-1][0], encode(Commit(0, 1, 9, datetime(2026, 1, 2, tzinfo=timezone.utc))))
    with pytest.raises(PgOutputError, match="does not close the open transaction"):
        _walks(rows, [], columns=True)
