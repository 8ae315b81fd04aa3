"""The fold's rules, declared once: what one change does to a key, from a start where the key has a row or not.

A batch is reduced to the net effect of each key's changes, in commit order, once as if the key existed
before the batch and once as if not (docs/adr/two-reducers-one-fold.md). Each change is a step of that
fold, and what a step does depends on three things only: the operation (I, U, D), whether the key has a
row at that point, and the conflict policy. :data:`FOLD_RULES` says, for each, whether a row is left,
what becomes of the row's cells (a value and a flag per subscriber column), whether the change meets a
conflict, and whether it is skipped and counted. The three reducers derive their code from it:

- flows/apply/net_effect.py walks each key's changes and applies :func:`step` per change
  (flows/apply/change_rows.py ``_folded``), and turns a key's only change into its outcome from :func:`step` too
  (``_single``);
- flows/apply/arrow_fold.py builds its pyarrow.compute kernels from :func:`step` per operation (a key's only
  change) and from :func:`repeated_updates` (a key changed only by UPDATEs that carry every column);
- spark/fold_expressions.py builds the Spark expressions of both from :func:`step`.

So a rule is written here once; the truth table (tests/apply/test_fold.py) runs every engine against it.

The rules are PostgreSQL's apply worker's (src/backend/replication/logical/worker.c): an UPDATE or DELETE
that finds no row is skipped and counted (apply_handle_update_internal, apply_handle_delete_internal);
an INSERT that finds its key stops the apply with a unique violation (ExecInsert), which the ``error``
policy reports as the key's first conflict; ``upsert`` makes such an INSERT overwrite the row and an UPDATE
that finds none insert what it carries, the other columns taking their default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: What a step does to the row's cells (a value and a flag per subscriber column; flag 0: the value is the
#: change's, 1: the column's default, 2: the subscriber's current value).
#: ``keep``: unchanged; ``set``: every cell the change's (an INSERT carries a value or a default for each);
#: ``overlay``: the cells the change carries (flag 0) overwritten, the others kept; ``restart``: a new row,
#: the cells the change carries and the others their default (flag 1).
Cells = Literal["keep", "set", "overlay", "restart"]
#: What a skipped change is counted as (subscriber/apply_stage.py ``OUTCOME_FIELDS``).
Counted = Literal["missing_update", "missing_delete"]
#: Any policy the rule does not name more precisely.
ANY = "*"


@dataclass(frozen=True, slots=True)
class Step:
    """What one change does to a key."""

    present: bool  # the key has a row after the change
    cells: Cells
    conflict: bool = False  # the change meets the row: the key's first such change is its conflict
    counted: Counted | None = None  # the change finds no row: skipped, and counted

    @property
    def writes(self) -> bool:
        """Whether the change's values are in the row's cells after it."""
        return self.cells != "keep"


#: (operation, the key has a row before the change, conflict policy) -> the step. A rule for a policy
#: overrides the rule for :data:`ANY`.
FOLD_RULES: dict[tuple[str, bool, str], Step] = {
    ("I", True, ANY): Step(present=True, cells="set"),
    ("I", True, "error"): Step(present=True, cells="set", conflict=True),  # ExecInsert: unique violation
    ("I", False, ANY): Step(present=True, cells="set"),
    ("U", True, ANY): Step(present=True, cells="overlay"),
    ("U", False, ANY): Step(present=False, cells="keep", counted="missing_update"),
    ("U", False, "upsert"): Step(present=True, cells="restart"),
    ("D", True, ANY): Step(present=False, cells="keep"),
    ("D", False, ANY): Step(present=False, cells="keep", counted="missing_delete"),
}

OPERATIONS = ("I", "U", "D")


def step(op: str, present: bool, policy: str) -> Step:
    """The rule of ``op`` on a key that has a row (``present``) or not, under ``policy``."""
    rule = FOLD_RULES.get((op, present, policy))
    return FOLD_RULES[op, present, ANY] if rule is None else rule


def steps(policy: str) -> dict[tuple[str, bool], Step]:
    """Every rule under ``policy``, by (operation, the key has a row): what a walk looks up per change."""
    return {(op, present): step(op, present, policy) for op in OPERATIONS for present in (True, False)}


def single_flags(rule: Step, change_flags: str | None) -> str | None:
    """The flags a key's only change leaves from the start (every cell the subscriber's: flag 2), where it leaves
    a row; None where it leaves none (the subscriber reads no flag of an outcome without a row).

    ``change_flags``: the change's own, 0 carried and 1 not (an INSERT or UPDATE has them)."""
    if not rule.present:
        return None
    flags = change_flags or ""
    if rule.cells == "overlay":  # a cell the change does not carry keeps the subscriber's value
        return flags.replace("1", "2")
    if rule.cells == "keep":
        return "2" * len(flags)
    return flags  # set, restart: what the change carries, the others their default


@dataclass(frozen=True, slots=True)
class RepeatedUpdates:
    """The net effect of n ≥ 2 UPDATEs of one key that each carry every column, from one start: the fold of
    :func:`step` over them, which reaches a fixpoint after the first (so it is the same for every n)."""

    present: bool
    last_values: bool  # the cells are the last UPDATE's values (flags 0); otherwise the start's (flags 2)
    missing_update_first: int  # the first UPDATE's count
    missing_update_after: int  # each later UPDATE's count


def repeated_updates(existed: bool, policy: str) -> RepeatedUpdates | None:
    """The fold of repeated full UPDATEs derived from :func:`step`; None when the rules make it depend on more
    than the count (a conflict, a change found by a later UPDATE only, a DELETE's count): then the walk folds it."""
    first = step("U", existed, policy)
    after = step("U", first.present, policy)
    if step("U", after.present, policy) != after or after.present != first.present:
        return None
    if first.conflict or after.conflict or first.writes != after.writes:
        return None
    if "missing_delete" in (first.counted, after.counted):
        return None
    return RepeatedUpdates(after.present, after.writes, int(first.counted == "missing_update"),
                           int(after.counted == "missing_update"))
