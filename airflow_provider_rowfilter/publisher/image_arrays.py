"""A fetch's decoded row images (publisher/pgoutput_columns.py) as the change log's list columns, in Arrow.

The text values' bytes are gathered from the fetch's message buffer in one step, and checked (or
decoded) as the publisher's server encoding; the result is a pair of list arrays per image, the values
and the unchanged-TOASTed flags, as change_log/segment_schema.py ``SCHEMA`` holds them (``new_values`` and
``new_unchanged``, ``old_values`` and ``old_unchanged``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.change_log.segment_schema import SCHEMA
from airflow_provider_rowfilter.publisher.pgoutput_columns import TEXT, UNCHANGED, GatheredImages, ImageCells

TEXTS = SCHEMA.field("new_values").type
FLAGS = SCHEMA.field("new_unchanged").type


def _texts(binary: pa.Array, encoding: str, where: Callable[[int], str] | None = None) -> pa.Array:
    """``binary`` values as text: UTF-8 checked by Arrow, any other encoding decoded value by value.

    :param where: describes the value at an index, for the error (which table, column and change).
    """
    try:
        if encoding == "utf-8":
            return binary.cast(pa.string())
        return pa.array([None if v is None else v.decode(encoding) for v in binary.to_pylist()], pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        values = binary.to_pylist()
        bad = next(i for i, v in enumerate(values) if v is not None and not _decodes(v, encoding))
        name = "UTF-8" if encoding == "utf-8" else encoding
        raise ChangeLogError(f"a text value is not valid {name}: {values[bad][:40]!r}",
                             detail=None if where is None else f"the value of {where(bad)}",
                             hint="the publisher sent bytes its server_encoding does not allow; nothing was "
                             "written and the slot was not advanced") from None


def _decodes(value: bytes, encoding: str) -> bool:
    try:
        value.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def image_arrays(buffer: np.ndarray, images: ImageCells | GatheredImages, encoding: str = "utf-8",
                 where: Callable[[int, int], str] | None = None) -> tuple[pa.Array, pa.Array]:
    """The ``(values, unchanged)`` list arrays of decoded images (publisher/pgoutput_columns.py).

    The text values' bytes are gathered from the message buffer in one step; a NULL or unchanged
    TOASTed value is a NULL element, an absent image a NULL list.

    :param where: describes the value of (image, column) for an error about it.
    """
    if isinstance(images, GatheredImages):  # the C decoder gathered them (publisher/pgoutput_columns.py)
        binary, unchanged = images.values, images.unchanged
    else:
        text = images.kinds == TEXT
        lengths = np.where(text, images.lengths, 0)
        ends = np.cumsum(lengths)
        total = int(ends[-1]) if len(ends) else 0
        offsets = np.zeros(len(lengths) + 1, np.int64)
        offsets[1:] = ends
        data = buffer[np.repeat(images.starts - offsets[:-1], lengths) + np.arange(total)]
        binary_type, offset_type = (pa.binary(), np.int32) if total < 2**31 else (pa.large_binary(), np.int64)
        binary = pa.Array.from_buffers(
            binary_type, len(lengths),
            [pa.py_buffer(np.packbits(text, bitorder="little")), pa.py_buffer(offsets.astype(offset_type)),
             pa.py_buffer(data)], null_count=int(len(lengths) - np.count_nonzero(text)))
        unchanged = pa.array(images.kinds == UNCHANGED)

    def cell(i: int) -> str:
        image = int(np.searchsorted(images.offsets, i, side="right")) - 1
        return where(image, i - int(images.offsets[image])) if where else f"value {i}"
    texts = _texts(binary, encoding, cell)
    lists = pa.array(images.offsets.astype(np.int32))
    mask = pa.array(~images.present)
    return (pa.ListArray.from_arrays(lists, texts, type=TEXTS, mask=mask),
            pa.ListArray.from_arrays(lists, unchanged, type=FLAGS, mask=mask))
