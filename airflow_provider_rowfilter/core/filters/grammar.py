"""Row filters, syntax: parse one publication ``WHERE`` expression as PostgreSQL's grammar does.

sqlglot's PostgreSQL parser builds the tree (on tokens read by PostgreSQL's lexical rules,
core/filters/pg_lexer.py); the checks here repair, on the tokens, where sqlglot's grammar is looser than
gram.y: operators PostgreSQL does not ship, non-associative comparisons and IS tests, and the
precedence level of BETWEEN/IN/LIKE/ILIKE/SIMILAR. Types and PostgreSQL's row-filter restrictions
are core/filters/analysis.py's.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from airflow_provider_rowfilter.core.errors import InvalidRowFilterError, PublicationSyntaxError
from airflow_provider_rowfilter.core.filters.dialect import RowFilterPostgres, pg_tokenize, raise_pg_syntax_error

# The texts of PostgreSQL's row-filter errors (publicationcmds.c) that the syntax checks raise too.
INVALID = "invalid publication WHERE expression"
USER_OPERATOR = "User-defined operators are not allowed."
ONLY_SIMPLE = (
    "Only columns, constants, built-in operators, built-in data types, built-in collations, "
    "and immutable built-in functions are allowed."
)
MUTABLE = "User-defined or built-in mutable functions are not allowed."
USER_TYPE = "User-defined types are not allowed."
USER_COLLATION = "User-defined collations are not allowed."
SYSTEM_COLUMN = "System columns are not allowed."

# Operators PostgreSQL ships (pg_operator, OID < 16384) that a filter may spell; anything else the
# lexer yields is a user-defined operator or a typo.
BUILTIN_OPERATORS = frozenset({
    "=", "<>", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "^", "||", "~", "~*", "!~",
    "!~*", "~~", "!~~", "~~*", "!~~*", "@>", "<@", "&&", "->", "->>", "#>", "#>>", "?", "?|", "?&",
    "@?", "@@", "|/", "||/", "@", "&", "|", "#", "<<", ">>", "-|-", "&<", "&>", "<->", "::",
})
_OPERATOR_CHARS = set("+-*/<>=~!@#%^&|`?")


def parse_row_filter(sql: str) -> exp.Expr:
    """Parse a row-filter expression (the text inside ``WHERE ( … )``)."""
    dialect = RowFilterPostgres()
    tokens = pg_tokenize(dialect, sql)
    _check_operators(sql, tokens)
    _check_lists(sql, tokens)
    try:
        parsed = dialect.parser().parse(tokens, sql)
    except ParseError as e:
        info = e.errors[0] if e.errors else {}
        start = info.get("start_context", "")
        raise PublicationSyntaxError(
            f"syntax error: {info.get('description', str(e))}", source=sql,
            position=len(start) + 1 if start else None,
        ) from e
    if len(parsed) != 1 or parsed[0] is None:
        raise_pg_syntax_error(sql, tokens[-1] if tokens else None)
    tree = _rebind_quantified(parsed[0]).transform(_national, copy=False)
    _check_quantifier_places(sql, tree, tokens)
    _check_nonassociative(sql, tree, tokens)
    _check_pattern_operators(sql, tokens)
    _check_quantified_patterns(sql, tree, tokens)
    tree = _negated_quantified_regex(tree, tokens)
    return tree.transform(_row_in, copy=False)


_REGEX_TOKENS = (TokenType.RLIKE, TokenType.IRLIKE)


def _negated_quantified_regex(tree: exp.Expr, tokens: list) -> exp.Expr:
    """``t !~ ANY (…)`` is the operator ``!~`` on each element (true when some element does not match), where
    sqlglot, reading ``!`` as NOT, builds ``NOT t ~ ANY (…)`` (true when none matches). The quantified regular
    expressions of the tree and the ``~``/``~*`` tokens before a quantifier are both in text order: each whose token
    follows a ``!`` with nothing between is marked ``negate`` on the match and loses the NOT."""
    operators = [i for i, tok in enumerate(tokens[:-1])
                 if tok.token_type in _REGEX_TOKENS and _quantifier(tokens[i + 1])]
    nodes = [n for n in tree.find_all(exp.RegexpLike, exp.RegexpILike) if quantified_array(n.expression) is not None]
    positions = [node_position(n.expression) for n in nodes]
    if len(nodes) != len(operators) or None in positions:
        for node in nodes:  # not told apart: refused (core/filters/text.py quantified_pattern)
            node.set("unread", True)
        return tree
    ordered = [n for _, n in sorted(zip(positions, nodes, strict=True), key=lambda pair: pair[0] or 0)]
    for i, node in zip(operators, ordered, strict=True):
        bang = tokens[i - 1] if i else None
        if bang is not None and bang.text == "!" and bang.end + 1 == tokens[i].start \
                and isinstance(node.parent, exp.Not):
            not_node = node.parent
            node.set("negate", True)
            if not_node is tree:
                tree = node.pop()
            else:
                not_node.replace(node)
    return tree


def _check_quantified_patterns(sql: str, tree: exp.Expr, tokens: list) -> None:
    """gram.y's ``LIKE … ESCAPE`` takes a pattern, and ``LIKE ANY (…)`` is a subquery_Op, which has no
    ESCAPE; SIMILAR TO is no subquery_Op at all. sqlglot takes ``a LIKE ANY (ARRAY['x']) ESCAPE '!'``
    and ``a SIMILAR TO ANY (ARRAY['x'])``."""
    for tok, following in zip(tokens, tokens[1:], strict=False):
        if tok.text.upper().split() == ["SIMILAR", "TO"] and _quantifier(following):  # one token in sqlglot
            raise_pg_syntax_error(sql, following)
    for node in tree.find_all(exp.Escape):
        if isinstance(node.this, (exp.Like, exp.ILike)) and isinstance(node.this.expression, (exp.Any, exp.All)):
            after = node_position(node.this.expression) or 0
            raise_pg_syntax_error(sql, next(t for t in tokens if t.token_type == TokenType.ESCAPE
                                            and t.start + 1 > after))


def _quantifier(tok) -> bool:
    return tok.token_type != TokenType.VAR and tok.text.upper() in ("ANY", "SOME", "ALL")


# gram.y has no empty list and no empty parenthesis: expr_list, func_arg_list, in_expr's '(' expr_list
# ')' and array_expr_list are one or more items separated by commas, '(' a_expr ')' needs the a_expr.
# sqlglot takes `a IN ()`, `(())`, `a IN (1,)`, `coalesce(,a)` and `ARRAY[1,]`. Only a call (func_name
# '(' ')', ROW '(' ')') has empty parentheses; a word that introduces an expression is no call.
_OPENERS = {TokenType.L_PAREN, TokenType.L_BRACKET}
_CLOSERS = {TokenType.R_PAREN, TokenType.R_BRACKET}
_EXPRESSION_WORDS = {"IN", "ANY", "ALL", "SOME", "EXISTS", "ARRAY", "AND", "OR", "NOT", "CASE", "WHEN", "THEN",
                     "ELSE", "END", "BETWEEN", "SYMMETRIC", "ASYMMETRIC", "LIKE", "ILIKE", "TO", "IS", "FROM",
                     "ESCAPE", "AS", "COLLATE"}


def _names_a_call(tok) -> bool:
    if tok.token_type in (TokenType.VAR, TokenType.IDENTIFIER):
        return tok.text.upper() not in _EXPRESSION_WORDS or tok.token_type == TokenType.IDENTIFIER
    return tok.text.replace("_", "a").isalnum() and tok.text.upper() not in _EXPRESSION_WORDS


def _check_lists(sql: str, tokens: list) -> None:
    for i, tok in enumerate(tokens):
        previous = tokens[i - 1] if i else None
        kind, before = tok.token_type, previous.token_type if previous is not None else None
        if kind == TokenType.COMMA and (before is None or before in _OPENERS or before == TokenType.COMMA):
            raise_pg_syntax_error(sql, tok)
        if kind in _CLOSERS and before == TokenType.COMMA:
            raise_pg_syntax_error(sql, tok)
        if kind == TokenType.R_PAREN and before == TokenType.L_PAREN and (i < 2 or not _names_a_call(tokens[i - 2])):
            raise_pg_syntax_error(sql, tok)


def quantified_array(node: exp.Expr) -> tuple[str, exp.Expr] | None:
    """``ANY (…)``/``SOME (…)``/``ALL (…)`` on the right of a comparison or a LIKE: ("any" | "all", its
    operand). sqlglot gives a LIKE's ALL as exp.All; our dialect reads a comparison's as a call."""
    if isinstance(node, (exp.Any, exp.All)):
        inner = node.this
    elif isinstance(node, exp.Anonymous) and node.name.upper() in ("ALL", "SOME", "ANY") \
            and len(node.expressions) == 1:
        inner = node.expressions[0]
    else:
        return None
    while isinstance(inner, exp.Paren):
        inner = inner.this
    kind = "all" if isinstance(node, exp.All) or isinstance(node, exp.Anonymous) and node.name.upper() == "ALL" \
        else "any"
    return kind, inner


def row_fields(node: exp.Expr) -> list[exp.Expr] | None:
    """The fields of ``ROW(…)`` or ``(a, b, …)``; None when ``node`` is no row constructor."""
    if isinstance(node, exp.Tuple):
        return list(node.expressions)
    if isinstance(node, exp.Anonymous) and node.name.upper() == "ROW":
        return list(node.expressions)
    return None


def _row_in(node: exp.Expr) -> exp.Expr:
    """``(a, b) IN ((1, 2), (3, 4))`` is ``(a, b) = (1, 2) OR (a, b) = (3, 4)``: transformAExprIn (parse_expr.c)
    builds a row comparison (make_row_comparison_op) per item when the left side is a row constructor, so each
    is the AND of its pairs' ``=`` (not record_eq, for which two NULL fields are equal); NOT IN is its NOT."""
    if not isinstance(node, exp.In) or row_fields(node.this) is None or node.args.get("query") \
            or not node.expressions or any(row_fields(e) is None for e in node.expressions):
        return node
    return exp.Paren(this=exp.or_(*(exp.EQ(this=node.this.copy(), expression=e) for e in node.expressions)))


_EQUALITIES = (exp.EQ, exp.NEQ)
_ORDERINGS = (exp.LT, exp.LTE, exp.GT, exp.GTE)


def _rebind_quantified(tree: exp.Expr) -> exp.Expr:
    """``a = ANY (…) >= b`` is ``(a = ANY (…)) >= b`` in gram.y (``a_expr subquery_Op sub_type '(' a_expr ')'``
    is reduced with Op's precedence, above the comparisons), where sqlglot, binding < <= > >= tighter than
    = and <>, nests ``a = (ANY (…) >= b)``: turn such a node the way PostgreSQL reads it."""
    def rebind(node: exp.Expr) -> exp.Expr:
        inner = node.expression if isinstance(node, _EQUALITIES) else None
        if isinstance(inner, _ORDERINGS) and quantified_array(inner.this) is not None:
            return type(inner)(this=type(node)(this=node.this, expression=inner.this), expression=inner.expression)
        return node
    return tree.transform(rebind, copy=False)


def _national(node: exp.Expr) -> exp.Expr:
    """``N'…'`` is ``NCHAR '…'`` (scan.l xnstart), a constant of type character without a length (gram.y
    ConstCharacter: "allow to be unrestricted"), as ``'…'::bpchar`` is."""
    if not isinstance(node, exp.National):
        return node
    literal = exp.Literal.string(node.this)
    literal.meta.update(node.meta)
    return exp.Cast(this=literal, to=exp.DataType.build("bpchar", dialect="postgres"))


# What may stand left of ``ANY/SOME/ALL (…)``: gram.y's ``a_expr subquery_Op sub_type '(' a_expr ')'``, where
# subquery_Op is an operator (all_Op, ``OPERATOR(…)``) or [NOT] LIKE/ILIKE; nowhere else is ANY an expression.
_NOT_SUBQUERY_OPS = (exp.Connector, exp.Is, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Escape, exp.SimilarTo)


def _check_quantifier_places(sql: str, tree: exp.Expr, tokens: list) -> None:
    """``x = (ANY (a) >= TRUE)``, ``coalesce(ANY (a))``, ``NOT ANY (a)``: ANY (…) that is not the right operand of
    an operator is PostgreSQL's syntax error at the word ANY (sqlglot reads it as a call of a function ``any``)."""
    for node in tree.walk():
        if quantified_array(node) is None:
            continue
        parent = node.parent
        if isinstance(parent, exp.Binary) and node.arg_key == "expression" \
                and not isinstance(parent, _NOT_SUBQUERY_OPS):
            continue
        inner = node_position(node.this if isinstance(node, (exp.Any, exp.All)) else node.expressions[0])
        word = [t for t in tokens if _quantifier(t) and (inner is None or t.start + 1 < inner)]
        raise_pg_syntax_error(sql, word[-1] if word else None)


# gram.y declares comparisons and IS %nonassoc: `a = b = c` and `a IS NULL IS TRUE` are syntax
# errors there, while sqlglot nests them (wrapping the IS case in a parenthesis of its own).
_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
_OPERATOR_WORDS = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
_RESETS_IS = {TokenType.AND, TokenType.OR, TokenType.COMMA, TokenType.THEN, TokenType.WHEN, TokenType.ELSE,
              TokenType.END, TokenType.CASE}


def _check_nonassociative(sql: str, tree: exp.Expr, tokens: list) -> None:
    for node in tree.walk():
        # `a < ALL (…)` is a subquery_Op rule reduced with Op's precedence (%prec Op), above the
        # comparisons: `a < ALL (…) <= b` parses there, as (a < ALL (…)) <= b.
        if isinstance(node, _COMPARISONS) and isinstance(node.this, _COMPARISONS) \
                and quantified_array(node.this.expression) is None:
            word = _OPERATOR_WORDS[type(node)]
            raise PublicationSyntaxError(f'syntax error at or near "{word}"', source=sql,
                                         position=_operator_after(node.this, tokens))
        # sqlglot binds < <= > >= tighter than = and <> (MySQL's levels), nesting `a = b < c` to the
        # right; gram.y has one %nonassoc level since PostgreSQL 9.5, so the second operator is the error.
        if isinstance(node, _COMPARISONS) and isinstance(node.expression, _COMPARISONS):
            inner = node.expression
            word = _OPERATOR_WORDS[type(inner)]
            raise PublicationSyntaxError(f'syntax error at or near "{word}"', source=sql,
                                         position=_operator_after(inner.this, tokens))
    # `a IS DISTINCT FROM b IS …`: the rule ending in an expression conflicts with the next IS, which
    # %nonassoc turns into a syntax error; postfix tests (IS NULL, IS TRUE …) chain freely. Found on
    # the tokens: an IS after IS [NOT] DISTINCT FROM at the same depth, with no AND/OR/NOT/","/CASE
    # part between them.
    after_distinct: dict[int, bool] = {}
    depth = 0
    for i, tok in enumerate(tokens):
        kind = tok.token_type
        if kind == TokenType.L_PAREN:
            depth += 1
            after_distinct[depth] = False
        elif kind == TokenType.R_PAREN:
            depth -= 1
        elif kind == TokenType.IS:
            if after_distinct.get(depth):
                raise PublicationSyntaxError('syntax error at or near "IS"', source=sql, position=tok.start + 1)
            following = [t.text.upper() for t in tokens[i + 1 : i + 3]]
            after_distinct[depth] = following[:1] == ["DISTINCT"] or following == ["NOT", "DISTINCT"]
        elif kind in _RESETS_IS or (kind == TokenType.NOT and tokens[i - 1].token_type != TokenType.IS):
            after_distinct[depth] = False


def _operator_after(left: exp.Expr, tokens: list) -> int | None:
    """The 1-based position of the first comparison operator after the expression ``left`` ends."""
    ends = [n.meta["end"] for n in left.walk() if isinstance(n.meta, dict) and "end" in n.meta]
    after = max(ends, default=-1)
    return next((t.start + 1 for t in tokens if t.start > after and t.token_type in _COMPARISON_TOKENS), None)


_COMPARISON_TOKENS = {TokenType.EQ, TokenType.NEQ, TokenType.LT, TokenType.LTE, TokenType.GT, TokenType.GTE}


# gram.y puts BETWEEN, IN, LIKE, ILIKE and SIMILAR on one %nonassoc level: `a ILIKE b NOT BETWEEN c
# AND d` or `a LIKE b IN (1)` is a syntax error there, while sqlglot nests them. BETWEEN's lower bound
# is a b_expr, which holds no NOT. Found on the tokens, per nesting level: a second operator of the
# level before anything of lower precedence (AND, OR, a comparison, IS, ",", a CASE part) ends the
# first one's expression. The word forms only: `~~` is an ordinary operator in PostgreSQL.
_PATTERN_WORDS = {"LIKE", "ILIKE", "SIMILAR", "BETWEEN", "IN"}
_ENDS_PATTERN = {TokenType.OR, TokenType.EQ, TokenType.NEQ, TokenType.LT, TokenType.LTE, TokenType.GT,
                 TokenType.GTE, TokenType.IS, TokenType.COMMA, TokenType.WHEN, TokenType.THEN, TokenType.ELSE}
_OPENS = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.CASE}
_CLOSES = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.END}


def _pattern_word(tok) -> str | None:
    word = tok.text.split()[0].upper() if tok.text.strip() else ""
    return word if word in _PATTERN_WORDS and tok.token_type != TokenType.VAR else None


def _check_pattern_operators(sql: str, tokens: list) -> None:
    levels = [{"seen": False, "between": 0}]
    for i, tok in enumerate(tokens):
        kind, level = tok.token_type, levels[-1]
        previous = tokens[i - 1] if i else None
        if kind in _OPENS:
            levels.append({"seen": False, "between": 0})
        elif kind in _CLOSES:
            if len(levels) > 1:
                levels.pop()
        elif _pattern_word(tok):
            infix_not = previous is not None and previous.token_type == TokenType.NOT
            if level["seen"]:
                raise_pg_syntax_error(sql, previous if infix_not else tok)
            word = _pattern_word(tok)
            # IN's right side is a parenthesised list, after which bison reduces without looking
            # ahead: `a IN (1) LIKE b` parses, as (a IN (1)) LIKE b. `a LIKE ANY (…)` is a
            # subquery_Op, reduced with Op's precedence: `a LIKE ANY (…) IN (…)` parses too.
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            quantified = word in ("LIKE", "ILIKE") and following is not None and _quantifier(following)
            level["seen"] = word != "IN" and not quantified
            level["between"] += word == "BETWEEN"
        elif kind == TokenType.NOT:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if following is not None and _pattern_word(following) or (
                    previous is not None and previous.token_type == TokenType.IS):
                continue
            if level["between"]:  # NOT inside BETWEEN's lower bound
                raise_pg_syntax_error(sql, tok)
            level["seen"] = False
        elif kind == TokenType.AND:
            if level["between"]:
                level["between"] -= 1  # BETWEEN's own AND: its upper bound follows
            else:
                level["seen"] = False
        elif kind in _ENDS_PATTERN:
            level["seen"] = False




def _check_operators(sql: str, tokens: list) -> None:
    """Merge adjacent operator characters the way PostgreSQL's lexer does and vet each operator."""
    run: list = []

    def flush() -> None:
        if not run:
            return
        text = sql[run[0].start : run[-1].end + 1]
        if text not in BUILTIN_OPERATORS and text not in ("(", ")"):
            raise InvalidRowFilterError(INVALID, detail=USER_OPERATOR, source=sql, position=run[0].start + 1)
        run.clear()

    for tok in tokens:
        text = sql[tok.start : tok.end + 1]
        is_op = tok.token_type not in (TokenType.STRING, TokenType.IDENTIFIER, TokenType.VAR,
                                       TokenType.NUMBER) and text and set(text) <= _OPERATOR_CHARS
        if is_op and run and run[-1].end + 1 != tok.start:
            flush()
        if is_op:
            run.append(tok)
        else:
            flush()
    flush()



def node_position(node: exp.Expr) -> int | None:
    for n in node.walk(bfs=False):
        meta = n.meta if hasattr(n, "meta") else {}
        if isinstance(meta, dict) and "start" in meta:
            return meta["start"] + 1
    return None

