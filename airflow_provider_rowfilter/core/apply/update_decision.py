"""The UPDATE transformation of pgoutput (``pgoutput_row_filter``): one pure rule, used by Spark too."""

from __future__ import annotations

import enum


class ChangeKind(str, enum.Enum):
    """What an UPDATE is sent (and applied) as."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


def decide_update(old_match: bool | None, new_match: bool | None, *, old_row_present: bool = True) -> ChangeKind | None:
    """Return what an UPDATE is sent as, given the row filter's result on the old and the new row.

    NULL counts as no match (pgoutput.c ``pgoutput_row_filter_exec_expr``). Without an old row (replica
    identity DEFAULT/INDEX and the key unchanged) only the new row is evaluated and no transformation
    is possible; otherwise the decision table in ``pgoutput_row_filter``'s comment applies: neither →
    dropped (``None``); new only → INSERT; old only → DELETE; both → UPDATE.
    """
    new = new_match is True
    if not old_row_present:
        return ChangeKind.UPDATE if new else None
    old = old_match is True
    if old and new:
        return ChangeKind.UPDATE
    if new:
        return ChangeKind.INSERT
    if old:
        return ChangeKind.DELETE
    return None


# The table the Spark apply job evaluates as a CASE expression, derived from decide_update so that
# there is one source of truth: (old_match, new_match) -> kind, for rows that carry an old image.
UPDATE_DECISION_TABLE: dict[tuple[bool, bool], ChangeKind | None] = {
    (old, new): decide_update(old, new) for old in (False, True) for new in (False, True)
}
