"""How deep a row filter may nest: parsed on a deep stack, long AND/OR chains flattened, refused past a depth.

sqlglot's parser descends some 25 Python calls for each parenthesis, and the analysis, the folding, the Spark
translation and sqlglot's SQL generator recurse once or more per node: under Python's default limit a filter
nested 50 parentheses deep, ``NOT`` 3,000 times, or a 20,000-term ``OR`` chain ended in a RecursionError, where
PostgreSQL 18 takes ~10,000 parentheses, ~8,700 ``NOT`` and any length of ``OR`` (measured under its default
``max_stack_depth`` of 2MB: docs/row-filters.md, "Limits").

- :func:`deep_stack` runs the parse and the analysis of a filter (or a script) in a thread of its own with a large
  stack and recursion limit, so that depth is bounded by :data:`MAX_DEPTH`, not by where Python stops.
- :func:`flattened` turns a long chain of one connector into a balanced tree, as PostgreSQL's grammar makes one
  n-ary ``BoolExpr`` of a chain (``makeAndExpr``/``makeOrExpr`` in src/backend/parser/gram.y), so that 200,000
  ``OR`` terms are 18 levels deep, not 200,000. The operands keep their order (evaluation and short-circuit
  are unchanged, and sqlglot writes the chain back as it was: ``a OR b OR c``).
- :func:`bounded` refuses a tree nested deeper than :data:`MAX_DEPTH` with PostgreSQL's own error for a filter
  too deep for its stack (``stack depth limit exceeded``, ``check_stack_depth`` in src/backend/tcop/postgres.c):
  everything downstream (the translation, the generator, the apply's trees) then runs on an ordinary stack.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlglot import exp

from airflow_provider_rowfilter.core.errors import PublicationSyntaxError

#: The deepest filter tree accepted (sqlglot nodes from the root to the deepest leaf, after :func:`flattened`): about
#: 100 levels of nesting of any kind, which every step after the parse (the translation, the generator, the
#: refresh's and the apply's trees) walks under Python's default recursion limit from a stack that is already 300
#: calls deep (tests/core/filters/test_filter_depth.py). At 150 ``NOT`` the Spark translation needed ~900 calls.
MAX_DEPTH = 100
#: A chain of one connector longer than this becomes a balanced tree (shorter ones keep sqlglot's shape).
CHAIN_FLATTENED = 32
#: The stack and recursion limit of the thread that parses: sqlglot's ~25 calls per parenthesis far past the depth
#: where :func:`bounded` refuses (~800 levels), and more than 10 KB of stack for each call (a thread's stack is
#: reserved, not used, until it is needed). Deeper still, the parse stops at the limit with the same error.
STACK_BYTES = 256 * 1024 * 1024
RECURSION_LIMIT = 20_000
#: PostgreSQL's words (src/backend/tcop/postgres.c ``check_stack_depth``, SQLSTATE 54001).
STACK_DEPTH_EXCEEDED = "stack depth limit exceeded"

F = TypeVar("F", bound=Callable[..., Any])

_local = threading.local()
_lock = threading.Lock()
_running = 0
_previous_limit = 0


def deep_stack(fn: F) -> F:
    """Run ``fn`` in a thread with :data:`STACK_BYTES` of stack and :data:`RECURSION_LIMIT`, with the caller's
    context variables; a call from inside such a thread runs in place. A RecursionError becomes
    :func:`too_deep`'s error; every other outcome is ``fn``'s own."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "deep", False):
            return _guarded(fn, args, kwargs)
        outcome: dict[str, Any] = {}
        context = contextvars.copy_context()

        def target() -> None:
            _local.deep = True
            try:
                outcome["value"] = context.run(_guarded, fn, args, kwargs)
            except BaseException as e:  # handed to the caller's thread, raised there
                outcome["error"] = e

        _raise_limit()
        try:
            with _lock:  # the size applies to threads started after it: set and put back around this one
                before = threading.stack_size(STACK_BYTES)
                try:
                    thread = threading.Thread(target=target, name=f"rowfilter-deep-{fn.__name__}", daemon=True)
                    thread.start()
                finally:
                    threading.stack_size(before)
            thread.join()
        finally:
            _restore_limit()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return cast(F, wrapper)


def _guarded(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return fn(*args, **kwargs)
    except RecursionError:
        raise too_deep() from None


def too_deep(depth: int | None = None) -> PublicationSyntaxError:
    """PostgreSQL's error for an expression too deep for its stack, with the limit here and the fix."""
    found = f"it nests {depth} levels deep" if depth is not None else "it nests deeper than that"
    return PublicationSyntaxError(
        STACK_DEPTH_EXCEEDED,
        detail=f"A row filter may nest at most {MAX_DEPTH} levels deep here (parentheses, NOT, operators and "
        f"function calls inside one another); {found}. Chains of AND or OR and IN lists may be of any length.",
        hint="write the filter flatter: a IN (1, 2, 3) or a = 1 OR a = 2 OR a = 3 instead of nested parentheses, "
        "and without repeated NOT or unary minus")


def flattened(tree: exp.Expr) -> exp.Expr:
    """``tree`` with every chain of more than :data:`CHAIN_FLATTENED` ``AND`` (or ``OR``) operands made a balanced
    tree of the same operands in the same order (in place; the new root when the root was such a chain)."""
    root = tree
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (exp.And, exp.Or)) and type(node.parent) is not type(node):
            operands = _operands(node)
            if len(operands) > CHAIN_FLATTENED:
                for operand in operands:
                    operand.pop()
                balanced = _balanced(type(node), operands)
                if node is root:
                    root = balanced
                else:
                    node.replace(balanced)
                pending.extend(operands)
                continue
        pending.extend(node.iter_expressions())
    return root


def _operands(chain: exp.Expr) -> list[exp.Expr]:
    """The operands of a chain of ``chain``'s connector, left to right (iteratively: a chain may be 200,000 long)."""
    kind, operands, pending = type(chain), [], [chain]
    while pending:
        node = pending.pop()
        if type(node) is kind:
            pending.extend((node.expression, node.this))  # popped left first
        else:
            operands.append(node)
    return operands


def _balanced(kind: type[exp.Connector], operands: list[exp.Expr]) -> exp.Expr:
    if len(operands) == 1:
        return operands[0]
    middle = len(operands) // 2
    return kind(this=_balanced(kind, operands[:middle]), expression=_balanced(kind, operands[middle:]))


def depth(tree: exp.Expr) -> int:
    """The number of nodes on the longest path from ``tree`` to a leaf (iteratively)."""
    deepest, pending = 0, [(tree, 1)]
    while pending:
        node, level = pending.pop()
        deepest = max(deepest, level)
        pending.extend((child, level + 1) for child in node.iter_expressions())
    return deepest


def bounded(tree: exp.Expr) -> exp.Expr:
    """``tree`` :func:`flattened`, when it is at most :data:`MAX_DEPTH` deep; else :func:`too_deep`'s error."""
    tree = flattened(tree)
    found = depth(tree)
    if found > MAX_DEPTH:
        raise too_deep(found)
    return tree


def _raise_limit() -> None:
    global _running, _previous_limit
    with _lock:
        if _running == 0:
            _previous_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_previous_limit, RECURSION_LIMIT))  # the interpreter's, for every thread
        _running += 1


def _restore_limit() -> None:
    global _running
    with _lock:
        _running -= 1
        if _running == 0:
            sys.setrecursionlimit(_previous_limit)
