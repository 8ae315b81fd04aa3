"""A fetch's row images decoded in bulk, as the change log's list columns (publisher/image_arrays.py)."""

from __future__ import annotations

import pytest

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.publisher.image_arrays import image_arrays
from airflow_provider_rowfilter.publisher.pgoutput_columns import decode_changes, message_buffer


def test_images_decoded_in_bulk_become_list_columns_and_invalid_text_names_its_value():
    """The capture's path (publisher/pgoutput_columns.py): the error says which value the capture was writing."""
    messages = [b"I\x00\x00\x40\x10N\x00\x03t\x00\x00\x00\x011t\x00\x00\x00\x02\xc3\xa9n",
                b"D\x00\x00\x40\x10K\x00\x01t\x00\x00\x00\x012",
                b"U\x00\x00\x40\x10N\x00\x02t\x00\x00\x00\x013u"]
    buffer, starts, ends = message_buffer(messages)
    decoded = decode_changes(buffer, starts, ends)
    values, unchanged = image_arrays(buffer, decoded.new)
    assert values.to_pylist() == [["1", "é", None], None, ["3", None]]
    assert unchanged.to_pylist() == [[False, False, False], None, [False, True]]
    assert image_arrays(buffer, decoded.old)[0].to_pylist() == [None, ["2"], None]

    messages[1] = b"I\x00\x00\x40\x10N\x00\x02t\x00\x00\x00\x012t\x00\x00\x00\x02\xc3("
    buffer, starts, ends = message_buffer(messages)
    with pytest.raises(ChangeLogError, match=r"a text value is not valid UTF-8: b'\\xc3\('") as caught:
        image_arrays(buffer, decode_changes(buffer, starts, ends).new, "utf-8", lambda i, c: f"image {i} column {c}")
    assert caught.value.detail == "the value of image 1 column 1"
