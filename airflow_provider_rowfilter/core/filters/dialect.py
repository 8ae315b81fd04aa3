"""sqlglot's PostgreSQL dialect, extended with the publication statements it does not know.

sqlglot parses ``CREATE PUBLICATION`` as an opaque ``Command``; we teach its parser PostgreSQL's
grammar (gram.y ``CreatePublicationStmt``, ``AlterPublicationStmt``, ``PublicationObjSpec``) so row
filters come out as real syntax trees with token positions, and nothing is parsed by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NoReturn

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from airflow_provider_rowfilter.core.errors import PublicationError, PublicationSyntaxError
from airflow_provider_rowfilter.core.filters.pg_lexer import reconcile, scan


class PublicationTableSpec(exp.Expression):
    """``TABLE [ONLY] name [*] [(columns)] [WHERE (expr)]``; ``filter_sql`` keeps the user's text."""

    arg_types = {"this": True, "only": False, "columns": False, "where": False, "filter_sql": False,
                 "filter_offset": False}


class PublicationSchemaSpec(exp.Expression):
    """``TABLES IN SCHEMA name`` (``this`` is None for ``CURRENT_SCHEMA``)."""

    arg_types = {"this": False}


class PublicationOption(exp.Expression):
    """``name [= value]`` inside ``WITH (…)`` / ``SET (…)``."""

    arg_types = {"this": True, "value": False}


class PublicationExceptSpec(exp.Expression):
    """One table of ``ALL TABLES EXCEPT (TABLE …)`` (PostgreSQL 19): gram.y's ``relation_expr``, ``[ONLY] name [*]``."""

    arg_types = {"this": True, "only": False}


class CreatePublication(exp.Expression):
    """``all_tables``/``all_sequences``: ``FOR ALL TABLES [EXCEPT (…)]``, ``FOR ALL SEQUENCES`` (19), in ``objects``
    the EXCEPT list's :class:`PublicationExceptSpec`; otherwise ``objects`` is the pub_obj_list."""

    arg_types = {"this": True, "all_tables": False, "all_sequences": False, "objects": False, "options": False}


class AlterPublication(exp.Expression):
    """``action`` is ADD, SET, DROP (objects), SET_ALL (``SET ALL TABLES [EXCEPT (…)], ALL SEQUENCES``: 19),
    SET_OPTIONS, RENAME or OWNER."""

    arg_types = {"this": True, "action": True, "objects": False, "options": False, "new_name": False,
                 "all_tables": False, "all_sequences": False}


class DropPublication(exp.Expression):
    arg_types = {"expressions": True, "exists": False}


class RowFilterPostgres(Postgres):
    """PostgreSQL as sqlglot reads it, plus publication DDL."""

    # sqlglot declares Dialect.Parser as a class variable, which mypy will not take as a base class.
    class Parser(Postgres.Parser):  # type: ignore[misc, valid-type]
        FUNCTION_PARSERS = {**Postgres.Parser.FUNCTION_PARSERS, "XMLEXISTS": lambda self: self._parse_xmlexists()}

        def _parse_xmlexists(self) -> exp.Expr:
            """gram.y ``XMLEXISTS '(' c_expr xmlexists_argument ')'``: xmlexists_argument is ``PASSING
            [xml_passing_mech] c_expr [xml_passing_mech]``, xml_passing_mech ``BY REF`` or ``BY VALUE`` (accepted and
            ignored). The result is what gram.y builds, a call of the function ``xmlexists(text, xml)``
            (``makeFuncCall(SystemFuncName("xmlexists"), list_make2($3, $4))``), so the rules judge it as any call."""
            name = self._tokens[self._index - 2]
            path = self._parse_c_expr()
            if not self._match_text_seq("PASSING"):
                self._syntax_error()
            self._match_passing_mechanism()
            document = self._parse_c_expr()
            self._match_passing_mechanism()
            if self._curr is None or self._curr.token_type != TokenType.R_PAREN:
                self._syntax_error()
            call = self.expression(exp.Anonymous(this="xmlexists", expressions=[path, document]))
            return call.update_positions(name)

        def _match_passing_mechanism(self) -> None:
            if self._match_text_seq("BY") and not self._match_texts(("REF", "VALUE")):
                self._syntax_error()

        def _parse_c_expr(self) -> exp.Expr:
            """gram.y's ``c_expr``: a column (with indirection), a constant, a call, ``( a_expr )``…, but no operator
            and no ``::`` cast outside parentheses (both are a_expr rules): the token of one is the syntax error."""
            start = self._index
            node = self._parse_column()
            if node is None:
                self._syntax_error()
            depth = 0
            for tok in self._tokens[start:self._index]:
                depth += (tok.token_type == TokenType.L_PAREN) - (tok.token_type == TokenType.R_PAREN)
                if depth == 0 and tok.token_type == TokenType.DCOLON:
                    raise_pg_syntax_error(self.sql, tok)
            return node

        def _parse_create(self):
            if self._match_text_seq("PUBLICATION"):
                return self._parse_create_publication()
            return super()._parse_create()

        def _parse_alter(self):
            if self._match_text_seq("PUBLICATION"):
                return self._parse_alter_publication()
            return super()._parse_alter()

        def _parse_drop(self, exists: bool = False, **kwargs):
            if self._match_text_seq("PUBLICATION"):
                if_exists = bool(self._match_text_seq("IF", "EXISTS"))
                names = self._parse_csv(self._parse_id_var)
                self._match_texts(("CASCADE", "RESTRICT"))
                self._expect_statement_end()
                return self.expression(DropPublication(expressions=names, exists=if_exists))
            return super()._parse_drop(exists=exists, **kwargs)

        _publication: str | None = None  # the statement's publication, to name in errors

        def _parse_create_publication(self) -> CreatePublication:
            name = self._parse_id_var(any_token=False)
            self._publication = name.name if name is not None else None
            all_tables = all_sequences = False
            objects: list[exp.Expr] = []
            if self._match(TokenType.FOR):
                if self._curr is not None and self._curr.token_type == TokenType.ALL:
                    all_tables, all_sequences, objects = self._parse_publication_all_objects()
                else:
                    objects = self._parse_publication_objects()
            options = self._parse_publication_options() if self._match(TokenType.WITH) else []
            self._expect_statement_end()
            return self.expression(CreatePublication(this=name, all_tables=all_tables, all_sequences=all_sequences,
                                                     objects=objects, options=options))

        def _parse_publication_all_objects(self) -> tuple[bool, bool, list[exp.Expr]]:
            """gram.y (PostgreSQL 19) ``pub_all_obj_type_list``: ``ALL TABLES [EXCEPT ( TABLE relation_expr [, [TABLE]
            relation_expr …] )]`` and ``ALL SEQUENCES``, separated by commas, each at most once
            (``preprocess_pub_all_objtype_list``); returns (all tables, all sequences, the EXCEPT list)."""
            seen: dict[str, bool] = {"TABLES": False, "SEQUENCES": False}
            excepted: list[exp.Expr] = []
            while True:
                word = self._curr
                if not self._match(TokenType.ALL):
                    self._syntax_error()
                kind = self._curr.text.upper() if self._curr is not None else ""
                if kind not in seen:
                    self._syntax_error()
                self._advance()
                if seen[kind]:
                    raise PublicationError("invalid publication object list", source=self.sql,
                                           detail=f"ALL {kind} can be specified only once.",
                                           position=word.start + 1)
                seen[kind] = True
                if kind == "TABLES" and self._match(TokenType.EXCEPT):
                    excepted = self._parse_publication_except_list()
                if not self._match(TokenType.COMMA):
                    return seen["TABLES"], seen["SEQUENCES"], excepted

        def _parse_publication_except_list(self) -> list[exp.Expr]:
            """``EXCEPT '(' TABLE pub_except_obj_list ')'``: the first table after the word TABLE, the others with it
            or without (``pub_except_obj_list ',' opt_table PublicationExceptObjSpec``); a relation_expr takes no
            column list and no WHERE."""
            if not self._match(TokenType.L_PAREN) or not self._match(TokenType.TABLE):
                self._syntax_error()
            tables: list[exp.Expr] = []
            while True:
                only = bool(self._match(TokenType.ONLY))
                if only and self._match(TokenType.L_PAREN):  # ONLY ( name )
                    table = self._parse_qualified_name()
                    self._match_r_paren()
                else:
                    table = self._parse_qualified_name()
                    if not only:
                        self._match(TokenType.STAR)
                tables.append(self.expression(PublicationExceptSpec(this=table, only=only)))
                if not self._match(TokenType.COMMA):
                    break
                self._match(TokenType.TABLE)
            if not self._match(TokenType.R_PAREN):
                self._syntax_error()
            return tables

        def _parse_alter_publication(self) -> AlterPublication:
            name = self._parse_id_var(any_token=False)
            self._publication = name.name if name is not None else None
            statement = self._parse_alter_publication_action(name)
            self._expect_statement_end()
            return statement

        def _parse_alter_publication_action(self, name: exp.Expr | None) -> AlterPublication:
            if self._match_text_seq("RENAME", "TO"):
                return self.expression(
                    AlterPublication(this=name, action="RENAME", new_name=self._parse_id_var())
                )
            if self._match_text_seq("OWNER", "TO"):
                self._parse_id_var()
                return self.expression(AlterPublication(this=name, action="OWNER"))
            if self._match(TokenType.SET) and self._curr and self._curr.token_type == TokenType.L_PAREN:
                return self.expression(
                    AlterPublication(this=name, action="SET_OPTIONS", options=self._parse_publication_options())
                )
            if self._prev.token_type == TokenType.SET and self._curr and self._curr.token_type == TokenType.ALL:
                all_tables, all_sequences, excepted = self._parse_publication_all_objects()
                return self.expression(AlterPublication(this=name, action="SET_ALL", all_tables=all_tables,
                                                        all_sequences=all_sequences, objects=excepted))
            if self._prev.token_type == TokenType.SET:
                action = "SET"
            elif self._match_text_seq("ADD"):
                action = "ADD"
            elif self._match(TokenType.DROP):
                action = "DROP"
            else:
                self._syntax_error()
            objects = self._parse_publication_objects()
            return self.expression(AlterPublication(this=name, action=action, objects=objects))

        def _parse_publication_objects(self) -> list[exp.Expr]:
            objects: list[exp.Expr] = []
            kind = None
            while True:
                continuation = True
                if self._match_text_seq("TABLES", "IN", "SCHEMA"):
                    kind, continuation = "schema", False
                elif self._match(TokenType.TABLE):
                    kind, continuation = "table", False
                elif kind is None:
                    if self._curr is not None and self._curr.token_type in (TokenType.VAR, TokenType.IDENTIFIER):
                        raise PublicationError(
                            "invalid publication object list",
                            detail="One of TABLE or TABLES IN SCHEMA must be specified before a standalone "
                            "table or schema name.", source=self.sql, position=self._curr.start + 1)
                    self._syntax_error()
                if kind == "table":
                    objects.append(self._parse_publication_table())
                elif self._match_text_seq("CURRENT_SCHEMA") or self._match(TokenType.CURRENT_SCHEMA):
                    objects.append(self.expression(PublicationSchemaSpec(this=None)))
                else:
                    objects.append(self.expression(PublicationSchemaSpec(this=self._parse_id_var())))
                    self._reject_schema_decoration(continuation)
                if not self._match(TokenType.COMMA):
                    return objects

        def _reject_schema_decoration(self, continuation: bool) -> None:
            """gram.y: ``TABLES IN SCHEMA s`` takes neither a column list nor WHERE.

            Right after the keywords it is a syntax error; on a bare name continuing the list the
            grammar reads a generic object and preprocess_pubobj_list reports it in words.
            """
            token = self._curr
            if token is None or token.token_type not in (TokenType.L_PAREN, TokenType.WHERE):
                return
            if not continuation:
                self._syntax_error()
            if token.token_type == TokenType.L_PAREN:
                raise PublicationError("column specification not allowed for schema", source=self.sql,
                                       position=self._prev.start + 1)
            raise PublicationError("WHERE clause not allowed for schema", source=self.sql,
                                   position=self._prev.start + 1)

        def _parse_publication_table(self) -> PublicationTableSpec:
            only = bool(self._match(TokenType.ONLY))
            if only and self._match(TokenType.L_PAREN):  # ONLY (name) is valid grammar too
                table = self._parse_qualified_name()
                self._match_r_paren()
            else:
                table = self._parse_qualified_name()
            self._match(TokenType.STAR)
            columns = None
            if self._curr and self._curr.token_type == TokenType.L_PAREN:
                # gram.y: opt_column_list is '(' columnList ')', at least one ColId and no trailing comma
                columns = self._parse_pg_list(lambda: self._parse_id_var(any_token=False))
            where = filter_sql = filter_offset = None
            if self._match(TokenType.WHERE):
                if not self._curr or self._curr.token_type != TokenType.L_PAREN:
                    # gram.y: OptWhereClause is WHERE '(' a_expr ')'
                    self._syntax_error()
                open_paren = self._curr
                if self._next is not None and self._next.token_type == TokenType.R_PAREN:
                    # gram.y: a_expr is required; `WHERE ()` (blanks or a comment inside) is no
                    # "no filter" but PostgreSQL's syntax error at the ")"
                    try:
                        raise_pg_syntax_error(self.sql, self._next)
                    except PublicationSyntaxError as e:
                        e.hint = ("write the row condition inside WHERE ( … ), or leave WHERE out to publish "
                                  "every row of the table")
                        raise e.with_context(publication=self._publication, table=table.sql("postgres")) from None
                where = self._parse_wrapped(self._parse_assignment)
                close_paren = self._prev
                filter_offset = open_paren.end + 1
                filter_sql = self.sql[filter_offset : close_paren.start]
            return self.expression(
                PublicationTableSpec(
                    this=table, only=only, columns=columns, where=where,
                    filter_sql=filter_sql, filter_offset=filter_offset,
                )
            )

        def _parse_qualified_name(self) -> exp.Table:
            # Not _parse_table_parts: it would read ``t (a, b)`` as a call of function t.
            parts = [self._parse_id_var(any_token=False)]
            while self._match(TokenType.DOT):
                parts.append(self._parse_id_var(any_token=True))
            if parts[0] is None or len(parts) > 3:
                self._syntax_error()
            return exp.Table(this=parts[-1], db=parts[-2] if len(parts) > 1 else None,
                             catalog=parts[-3] if len(parts) > 2 else None)

        def _parse_publication_options(self) -> list[PublicationOption]:
            def option() -> PublicationOption:
                key = self._parse_id_var(any_token=True)
                if key is None:
                    self._syntax_error()
                value = None
                if self._match(TokenType.EQ):
                    value = self._parse_primary() or self._parse_id_var(any_token=True)
                return self.expression(PublicationOption(this=key, value=value))

            # gram.y: definition is '(' def_list ')', at least one def_elem and no trailing comma
            return self._parse_pg_list(option)

        def _parse_pg_list(self, item: Callable[[], exp.Expr | None]) -> list:
            """``'(' item [, item …] ')'`` as gram.y spells a list: neither empty nor ending in a comma.

            (sqlglot's _parse_wrapped_csv takes both, reading ``(a, )`` as ``(a)``.)
            """
            if not self._match(TokenType.L_PAREN):
                self._syntax_error()
            items = []
            while True:
                parsed = item()
                if parsed is None:
                    self._syntax_error()
                items.append(parsed)
                if not self._match(TokenType.COMMA):
                    break
            if not self._match(TokenType.R_PAREN):
                self._syntax_error()
            return items

        def _expect_statement_end(self) -> None:
            """A publication statement ends at ``;`` or the end of the text; gram.y has nothing to
            read a further token with (``… WHERE (a) WHERE (b)``), so the token is the syntax error."""
            if self._curr.token_type not in (TokenType.SEMICOLON, TokenType.SENTINEL):
                self._syntax_error()

        def _syntax_error(self) -> NoReturn:
            raise_pg_syntax_error(self.sql, self._curr)


def identifier_name(node: exp.Expr | None) -> str:
    """PostgreSQL folds unquoted identifiers to lower case."""
    if node is None:
        return ""
    if isinstance(node, exp.Identifier):
        return node.this if node.quoted else node.this.lower()
    return node.name.lower()


def raise_pg_syntax_error(sql: str, token: Token | None) -> NoReturn:
    """Raise PostgreSQL's ``syntax error at or near "…"`` for ``token``."""
    # sqlglot's parser stands on a SENTINEL token past the last one
    if token is None or token.token_type == TokenType.SENTINEL or (
            token.token_type == TokenType.SEMICOLON and not token.text):
        raise PublicationSyntaxError("syntax error at end of input", source=sql, position=len(sql) + 1)
    text = sql[token.start : token.end + 1] or token.text
    raise PublicationSyntaxError(f'syntax error at or near "{text}"', source=sql, position=token.start + 1)


def pg_tokenize(dialect: RowFilterPostgres, sql: str, *, server_version_num: int = 180000) -> list[Token]:
    """sqlglot's tokens of ``sql``, read by PostgreSQL's lexical rules (core/filters/pg_lexer.py).

    Raises PostgreSQL's lexical errors as the publisher's version (``server_version_num``) raises them.
    """
    pg = scan(sql, server_version_num=server_version_num)
    try:
        tokens = dialect.tokenize(sql)
    except TokenError as e:  # scan() raises PostgreSQL's error first; this is a net for the rest
        raise PublicationSyntaxError(f"cannot tokenize the text: {e}", source=sql,
                                     hint="check the quotes and comments at the position shown") from None
    return reconcile(sql, pg, tokens)


def parse_statements(sql: str, *, server_version_num: int = 180000) -> list[exp.Expr]:
    """Parse a script of SQL statements with the publication-aware PostgreSQL dialect."""
    dialect = RowFilterPostgres()
    try:
        tokens = pg_tokenize(dialect, sql, server_version_num=server_version_num)
        with _quiet_sqlglot():
            return [s for s in dialect.parser().parse(tokens, sql) if s is not None]
    except PublicationError:
        raise
    except ParseError as e:
        # The description only: str(e) and the error's context quote the text (perhaps not SQL at all).
        first = e.errors[0] if e.errors else {}
        raise PublicationSyntaxError(
            f"syntax error: {first.get('description', 'the text does not parse')}",
            source=sql,
            position=None,
        ) from e


class _DropWhileParsing(logging.Filter):
    """sqlglot logs a statement it cannot parse, whole, at WARNING ("… contains unsupported syntax"): a line of
    a file that may not be SQL, into task logs. While :func:`parse_statements` runs, it says nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _PARSING.get()


_PARSING: ContextVar[bool] = ContextVar("rowfilter_parsing", default=False)
logging.getLogger("sqlglot").addFilter(_DropWhileParsing())


@contextmanager
def _quiet_sqlglot() -> Iterator[None]:
    token = _PARSING.set(True)
    try:
        yield
    finally:
        _PARSING.reset(token)
