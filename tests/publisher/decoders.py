"""The C decoder and the numpy one side by side, for the tests that compare them."""

from __future__ import annotations

from airflow_provider_rowfilter.change_log.log import ChangeLogError
from airflow_provider_rowfilter.publisher.image_arrays import image_arrays
from airflow_provider_rowfilter.publisher.pgoutput_columns import (
    Irregular,
    decode_changes_native,
    decode_changes_numpy,
    message_buffer,
)


def both_decoders(raw: list[bytes]):
    """Each decoder's result as comparable arrays, or "irregular"."""
    buffer, starts, ends = message_buffer(raw)
    out = []
    for decode in (decode_changes_native, decode_changes_numpy):
        try:
            d = decode(buffer, starts, ends)
        except Irregular:
            out.append("irregular")
            continue
        try:
            arrays = [a for image in (d.new, d.old) for a in image_arrays(buffer, image)]
        except ChangeLogError as e:  # a damaged value that is not UTF-8
            arrays = [str(e), e.detail]
        out.append((d.relation_oid.tolist(), d.old_kind.tolist(), arrays))
    return out
