"""What the row-filter rules need to know about PostgreSQL's built-in functions.

PostgreSQL decides with ``pg_proc.provolatile`` and the function's OID; the publisher catalog
supplies that for any name (``FunctionCatalog``). The tables here cover the built-ins that PostgreSQL
classifies specially (aggregates, window and set-returning functions) so the right error is raised
even without a catalog.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot import exp

AGGREGATES = frozenset({
    "avg", "bit_and", "bit_or", "bit_xor", "bool_and", "bool_or", "count", "every", "max", "min",
    "sum", "array_agg", "string_agg", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg",
    "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp", "corr", "covar_pop",
    "covar_samp", "mode", "percentile_cont", "percentile_disc", "xmlagg", "any_value",
})
WINDOW_FUNCTIONS = frozenset({
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
    "first_value", "last_value", "nth_value",
})
SET_RETURNING = frozenset({
    "generate_series", "unnest", "generate_subscripts", "regexp_matches", "json_each", "jsonb_each",
    "json_array_elements", "jsonb_array_elements", "json_object_keys", "jsonb_object_keys",
    "pg_get_keywords", "string_to_table", "regexp_split_to_table", "json_each_text", "jsonb_each_text",
})
# Built-ins that are not IMMUTABLE (provolatile s or v): PostgreSQL rejects them in a row filter.
MUTABLE_BUILTINS = frozenset({
    "now", "random", "random_normal", "clock_timestamp", "statement_timestamp",
    "transaction_timestamp", "timeofday", "current_date", "current_time", "current_timestamp",
    "localtime", "localtimestamp", "nextval", "currval", "lastval", "setval", "setseed", "txid_current",
    "pg_backend_pid", "current_setting", "set_config", "to_char", "to_timestamp", "to_date", "age",
    "concat", "concat_ws", "format", "current_database", "current_schema", "current_user",
    "session_user", "user", "gen_random_uuid", "uuidv4", "uuidv7", "pg_current_wal_lsn", "version",
})


@dataclass(frozen=True)
class FunctionCatalog:
    """Names of functions and operators that exist on the publisher, split by built-in or not.

    ``immutable_builtins`` lists built-in function names that have at least one IMMUTABLE variant;
    ``builtins`` all built-in function names; ``user_defined`` functions with OID >= 16384.
    An empty catalog (no publisher at hand) falls back to the tables above.
    """

    builtins: frozenset[str] = field(default_factory=frozenset)
    immutable_builtins: frozenset[str] = field(default_factory=frozenset)
    user_defined: frozenset[str] = field(default_factory=frozenset)
    user_defined_operators: frozenset[str] = field(default_factory=frozenset)
    builtin_operators: frozenset[str] = field(default_factory=frozenset)
    user_defined_collations: frozenset[str] = field(default_factory=frozenset)
    builtin_collations: frozenset[str] = field(default_factory=frozenset)

    def classify(self, name: str) -> str:
        """Say what PostgreSQL would find for a function name: ``immutable``, ``mutable``, ``user`` or ``missing``."""
        if name in self.user_defined and name not in self.builtins:
            return "user"
        if name in MUTABLE_BUILTINS:
            return "mutable"
        if self.builtins:
            if name not in self.builtins:
                return "missing"
            return "immutable" if name in self.immutable_builtins else "mutable"
        return "immutable"


# Spellings PostgreSQL resolves to one function (pg_proc aliases, and gram.y's TRIM(…) → btrim):
# the analysis and the Spark translation both know a function by the name this gives.
ALIASES = {"char_length": "length", "character_length": "length", "trim": "btrim"}


def function_name(node: exp.Func) -> str:
    """The PostgreSQL name of a function node (sqlglot renames some, e.g. random → Rand), aliases resolved.

    sqlglot also makes functions of some operators (``t ~ 'x'`` is RegexpLike, ``a @> b``
    ArrayContainsAll): those have no name here (""), so that no one reports ``function t()`` or
    ``function lower(text, unknown)`` for an operator.
    """
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
    else:
        rendered = node.sql(dialect="postgres")
        bare = re.fullmatch(r"\s*([A-Za-z_][A-Za-z_0-9]*)\s*", rendered)  # CURRENT_TIMESTAMP, CURRENT_USER
        match = bare or re.match(r"\s*([A-Za-z_][A-Za-z_0-9]*)\s*\(", rendered)
        if match is None or (bare is None and not _call_spans(rendered, match.end() - 1)):
            return ""
        name = match.group(1).lower()
    return ALIASES.get(name, name)


def _call_spans(text: str, open_at: int) -> bool:
    """Whether the parenthesis at ``open_at`` closes at the end of ``text`` (``f(a)``, not ``f(a) ~ b``)."""
    depth, quoted = 0, False
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                return text[i + 1 :].strip() == ""
    return False
