"""Regressions of the row-filter translation: each case is a disagreement the differential test found.

Every case gives a filter, rows in PostgreSQL's text form and PostgreSQL's result (True / False /
None per row, or ERROR when evaluating the filter over those rows raises). Two tests read the same
table: one replays each case on the real PostgreSQL (so the expectation cannot be wrong), the other
evaluates our Spark translation over the rows cast from that text (so the fix cannot regress).
Validity cases compare our validator with PostgreSQL's own ``CREATE PUBLICATION … WHERE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from airflow_provider_rowfilter.core.errors import (
    InvalidRowFilterError,
    PublicationError,
    UntranslatableFilterError,
)
from airflow_provider_rowfilter.core.filters.row_filter import validate_row_filter
from airflow_provider_rowfilter.core.filters.spark_translation import to_spark_sql
from tests.core.filters import filter_table as ft

ERROR = "error"


@dataclass(frozen=True)
class Case:
    id: str
    filter: str
    rows: tuple[dict[str, str], ...]  # column -> PostgreSQL's text output; missing = NULL
    expected: tuple[bool | None, ...] | str  # per row, or ERROR
    why: str


CASES = (
    Case("lower_of_a_constant", "lower('AB') = 'ab'", ({},), (True,),
         "lower('AB') was typed as the constant 'AB'"),
    Case("replace_of_a_constant", "replace('abc', 'b', 'x') = 'axc'", ({},), (True,),
         "replace('abc', …) was typed as the constant 'abc'"),
    Case("nullif_of_a_constant", "NULLIF('', COALESCE('', c)) IS NULL", ({"c": "ab  "}, {}), (True, True),
         "NULLIF('', …) was typed as the constant ''"),
    Case("varchar_cast_truncates", "(t)::varchar(3) = 'abc'", ({"t": "abcdef"}, {"t": "abc"}), (True, True),
         "an explicit cast to varchar(n) truncates silently"),
    Case("varchar_cast_of_a_literal_truncates", "'abcdef'::varchar(3) = t", ({"t": "abc"},), (True,),
         "the validator raised 'value too long' where PostgreSQL truncates"),
    Case("char_cast_pads", "(t)::char(3) LIKE 'a  '", ({"t": "a"}, {"t": "abcd"}), (True, False),
         "an explicit cast to character(n) pads and truncates; LIKE sees the padding"),
    Case("coalesce_with_char_takes_any_literal", "COALESCE(c, 'abcdef') = 'abcdef'", ({}, {"c": "ab  "}),
         (True, False), "an implicit coercion of a literal to character(4) has no length limit"),
    Case("char_equality_ignores_trailing_spaces", "c = 'ab'", ({"c": "ab  "}, {"c": "a   "}), (True, False),
         "bpchareq compares without trailing spaces; the Spark value keeps PostgreSQL's padding"),
    Case("char_order_ignores_trailing_spaces", "c < 'ab!'", ({"c": "ab  "},), (True,),
         "bpcharlt compares without trailing spaces"),
    Case("char_in_list_ignores_trailing_spaces", "c IN ('ab ', 'x')", ({"c": "ab  "},), (True,),
         "the character = ANY (…) compares without trailing spaces"),
    Case("char_like_sees_the_padding", "c LIKE 'ab'", ({"c": "ab  "},), (False,),
         "bpcharlike matches the padded value"),
    Case("char_like_padding_pattern", "c LIKE 'ab  '", ({"c": "ab  "},), (True,),
         "bpcharlike matches the padded value"),
    Case("char_nullif_ignores_trailing_spaces", "NULLIF(c, 'ab') IS NULL", ({"c": "ab  "},), (True,),
         "NULLIF compares with bpchareq"),
    Case("round_of_an_integer_is_double_precision", "round(i8) = 9223372036854775806",
         ({"i8": "9223372036854775807"},), (True,),
         "round(bigint) resolves to round(double precision), not round(numeric)"),
    Case("in_list_items_with_columns_compare_pairwise", "i8 IN (f8, 9223372036854775806)",
         ({"i8": "9223372036854775807"},), (None,),
         "i8 = 9223372036854775806 is an exact bigint comparison, not one in double precision"),
    Case("in_list_character_against_text_and_literal", "c IN (t, 'ab ')", ({"c": "ab  ", "t": "x"},), (True,),
         "c = t compares as text, c = 'ab ' as character"),
    Case("in_list_constant_array_then_columns", "i8 IN (1, 2, f8, i4)",
         ({"i8": "2"}, {"i8": "5", "f8": "5"}, {"i8": "6", "i4": "7", "f8": "0"}), (True, True, False),
         "= ANY over the column-free items, then one comparison per item with columns"),
    Case("unicode_escape_string", "t = U&'\\0061\\+01F600'", ({"t": "a😀"}, {"t": "a"}), (True, False),
         "U&'…' was refused as untranslatable: it is a text constant once its escapes are decoded"),
    Case("unicode_escape_string_with_uescape", "t = U&'!0061!!' UESCAPE '!' || U&'\\D83D\\DE00'",
         ({"t": "a!😀"},), (True,), "UESCAPE names the escape character; a surrogate pair is one character"),
    Case("date_constant_out_of_range_raises_for_every_row", "d IS NULL OR d > '2338-07-31'::date - 2147483647",
         ({},), ERROR, "the planner folds date_mii of constants and raises; Spark skipped it once d IS NULL held "
         "(found by the differential test through NOT BETWEEN)"),
    Case("negated_typed_constant_overflows", "(- '-32768'::smallint) = i2", ({"i2": "1"},), ERROR,
         "only a numeric literal takes the minus sign at parse time; int2um(-32768) raises 'smallint out of range'"),
    Case("negated_cast_constant_overflows", "i4 - -32768::smallint > 0", ({"i4": "1"},), ERROR,
         "the unary minus applies after the cast, -(32768::smallint): int42 raises 'smallint out of range'"),
    # The planner folds a call of constants once, before any row (core/filters/folding.py): an error there is
    # every row's; what it prunes is never run.
    Case("negated_cast_constant_under_is_null", "(i4 - -32768::smallint) IS NULL", ({"i4": "1"}, {}), ERROR,
         "Spark decided IS NULL from i4 alone and never computed -(32768::smallint)"),
    Case("constant_overflow_in_a_branch_not_taken", "CASE WHEN i4 > 0 THEN 1 ELSE 32768::smallint END = 1",
         ({"i4": "1"},), ERROR, "the ELSE of a CASE whose condition is not constant is folded: int42 raises"),
    Case("constant_integer_overflow", "2147483647 + 1 > i4", ({"i4": "1"},), ERROR,
         "int4pl of two constants raises 'integer out of range' when the filter is prepared"),
    Case("constant_false_ends_an_and", "i4 > 0 AND false AND 32768::smallint > 0", ({"i4": "1"}, {}),
         (False, False), "simplify_and_arguments stops at a constant FALSE: what follows is never folded"),
    Case("constant_true_ends_an_in_list", "1 IN (1, 2, i4 + 2147483647 * 2)", ({"i4": "1"},), (True,),
         "x = ANY (ARRAY[1, 2]) is a constant TRUE: the OR of the IN list stops before the item with a column"),
    Case("false_alternative_never_folded", "CASE WHEN 1 = 2 THEN 32768::smallint ELSE i2 END = 1",
         ({"i2": "1"}, {"i2": "2"}), (True, False), "a constant FALSE alternative is dropped unfolded"),
    Case("coalesce_stops_at_a_constant", "COALESCE(i4, 1, 32768::smallint) > 0", ({"i4": "1"}, {}), (True, True),
         "COALESCE drops every argument after its first non-NULL constant"),
    Case("between_is_an_and", "NOT (1 BETWEEN 2 AND 1 / 0) AND i4 = 1", ({"i4": "1"},), (True,),
         "1 >= 2 is FALSE: the AND that BETWEEN becomes stops before 1 / 0"),
    Case("numeric_cast_overflow_of_a_constant", "i4 > 0 OR (123.45)::numeric(3,1) > 0", ({"i4": "1"},), ERROR,
         "apply_typmod raises 'numeric field overflow' when the planner folds the cast"),
    # op ANY/ALL over an array column: the elements read from PostgreSQL's text form (array_out), NULL rules of
    # ScalarArrayOpExpr.
    Case("any_over_an_array_column", "i4 = ANY (ia)",
         ({"i4": "2", "ia": "{1,2,NULL}"}, {"i4": "5", "ia": "{1,NULL}"}, {"i4": "5", "ia": "{}"}, {"i4": "5"},
          {"ia": "{1}"}, {"i4": "3", "ia": "{{1,2},{3,4}}"}, {"i4": "8", "ia": "[0:1]={7,8}"}),
         (True, None, False, None, None, True, True),
         "= ANY over an array column was refused: a match is true, else NULL with a NULL element or subject"),
    Case("any_then_a_comparison", "i4 = ANY (ia) >= TRUE",
         ({"i4": "2", "ia": "{1,2}"}, {"i4": "5", "ia": "{1}"}, {"i4": "5", "ia": "{1,NULL}"}),
         (True, False, None), "(i4 = ANY (ia)) >= TRUE: gram.y reduces op ANY (…) above the comparisons, where sqlglot "
         "nested i4 = (ANY (ia) >= TRUE) and the validator refused it (found by the differential test)"),
    Case("all_over_an_array_column", "i8 > ALL (ia)",
         ({"i8": "5", "ia": "{1,2}"}, {"i8": "5", "ia": "{}"}, {"i8": "1", "ia": "{1,NULL}"},
          {"i8": "9", "ia": "{1,NULL}"}),
         (True, True, False, None), "int84gt on each element: ALL is false at a miss, true when empty"),
    Case("any_over_an_array_column_evaluates_its_subject_first", "abs(i8) = ANY (ia)",
         ({"i8": "-9223372036854775808"},), ERROR,
         "ExecEvalScalarArrayOp has abs(i8) evaluated before it looks at the (NULL) array: 'bigint out of range'"),
    Case("all_over_an_empty_array_column_evaluates_its_subject_first", "abs(i8) <> ALL (ia)",
         ({"i8": "-9223372036854775808", "ia": "{}"},), ERROR, "the same for an empty array"),
    # op ANY/ALL over COALESCE / CASE of array columns and constants: the array one branch gives, untouched
    Case("any_over_a_coalesce_of_arrays", "i4 = ANY (COALESCE(ia, '{7,NULL}'))",
         ({"i4": "7"}, {"i4": "2", "ia": "{1,2}"}, {"i4": "5", "ia": "{{1,2},{3,5}}"}, {"i4": "5"},
          {"i4": "7", "ia": "{}"}, {"ia": "{1}"}),
         (True, True, True, None, False, None),
         "ANY over an expression was refused: COALESCE's value is one of its arrays, with the column case's NULL rules"),
    Case("all_over_a_case_of_arrays", "i8 > ALL (CASE WHEN b THEN ia ELSE '{1,2}'::int[] END)",
         ({"i8": "3", "b": "t", "ia": "{1,4}"}, {"i8": "3", "b": "f", "ia": "{1,4}"}, {"i8": "3", "b": "t", "ia": "{}"},
          {"i8": "3", "b": "t"}, {"i8": "2", "ia": "{NULL}"}),
         (False, True, True, None, False),
         "ALL over CASE: the branch's array (a NULL array is NULL, an empty one true), compared as int84gt"),
    Case("like_any_over_a_simple_case_of_text_arrays", "t LIKE ANY (CASE i4 WHEN 1 THEN ta END)",
         ({"t": "ab", "i4": "1", "ta": "{x,a%}"}, {"t": "ab", "i4": "2", "ta": "{a%}"},
          {"t": "ab", "i4": "1", "ta": "{x,NULL}"}),
         (True, None, None), "LIKE on each element of the simple CASE's array; no branch is a NULL array"),
    Case("any_over_an_array_column_cast_to_its_own_type", "i4 = ANY (COALESCE(ia::int[], '{9}'))",
         ({"i4": "9"}, {"i4": "2", "ia": "{1,2}"}, {"i4": "3", "ia": "{1,NULL}"}), (True, True, None),
         "a cast to the array's own type converts nothing: the column's elements, untouched"),
    Case("any_over_a_coalesce_evaluates_its_subject_first", "abs(i8) = ANY (COALESCE(ia, ia))",
         ({"i8": "-9223372036854775808"},), ERROR,
         "ExecEvalScalarArrayOp has abs(i8) evaluated before the (NULL) array, as for a column"),
    Case("row_all_raising_for_every_element", "(t, t) = ALL (ARRAY[ROW('a', NULL), ROW(NULL, NULL::text, 1)])",
         ({"t": ""}, {"t": "a,'"}), ERROR,
         "record_eq raises at the first element's untyped field; Spark reduced raise_error(…) AND raise_error(…), "
         "both of its NULL type, to NULL (found by the differential test)"),
    Case("any_over_a_text_array_column", "t = ANY (ta)",
         ({"t": "a,b", "ta": '{"a,b",c}'}, {"t": "NULL", "ta": '{"NULL"}'}, {"t": "x", "ta": "{NULL}"},
          {"t": "", "ta": '{""}'}, {"t": 'q"\\', "ta": '{"q\\"\\\\"}'}, {"t": "a b", "ta": '{"a b"}'}),
         (True, True, None, True, True, True),
         "array_out quotes an element holding , { } \" \\ or a space, or spelled NULL; an unquoted NULL is NULL"),
    Case("negated_literal_folds", "-32768 = i2", ({"i2": "-32768"}, {"i2": "1"}), (True, False),
         "a minus sign before a literal is part of the constant"),
    Case("float8_overflow_raises", "f8 * 10 > 0", ({"f8": "1e+308"},), ERROR,
         "float8_mul raises 'value out of range: overflow'; Spark yields Infinity"),
    Case("float8_infinity_times_ten_is_fine", "f8 * 10 > 0", ({"f8": "Infinity"},), (True,),
         "no overflow error when an input already is infinite"),
    Case("float8_underflow_raises", "f8 * f8 = 0", ({"f8": "1e-200"},), ERROR,
         "float8_mul raises 'value out of range: underflow'; Spark yields 0"),
    Case("float4_overflow_raises", "f4 + f4 > 0", ({"f4": "3e+38"},), ERROR,
         "float4_pl raises 'value out of range: overflow'"),
    Case("float_nan_divided_by_zero_is_nan", "f8 / 0::float8 = 'NaN'::float8", ({"f8": "NaN"},), (True,),
         "float8_div: NaN / 0 is NaN; Spark's ANSI division raises"),
    Case("float_divided_by_zero_raises", "f8 / 0::float8 = 1", ({"f8": "1"},), ERROR,
         "float8_div raises 'division by zero'"),
    Case("date_plus_integer_out_of_range", "d + i4 > d", ({"d": "2000-01-01", "i4": "2147483647"},), ERROR,
         "date_pli raises 'date out of range'; Spark's date_add does not"),
    Case("date_minus_integer_in_range", "d - i4 < d", ({"d": "2000-01-01", "i4": "730000"},), (True,),
         "the range check keeps valid dates, BC ones included"),
    Case("typed_constant_cast_rounds", "2.5::integer = 3", ({},), (True,),
         "numeric → integer is a cast function (round half away from zero), not int4in('2.5')"),
    Case("typed_constant_cast_overflows_at_run_time", "32768::int2 > i2", ({"i2": "1"},), ERROR,
         "PostgreSQL accepts the filter and raises 'smallint out of range' when evaluating it"),
    Case("varchar_against_character_compares_as_character", "starts_with(NULLIF(v, c), v)", ({"v": "b% "},),
         (False,), "varchar = character resolves to bpchareq, so NULLIF(v, c) is character (rtrimmed as text)"),
    Case("coalesce_of_real_and_numeric_is_real", "COALESCE(f4, n) = f8", ({"n": "0.100", "f8": "0.1"},), (False,),
         "select_common_type keeps real (numeric converts to real implicitly, not back)"),
    Case("coalesce_of_character_and_text_is_character", "COALESCE(c, t) LIKE 'ab'", ({"c": "ab  "},), (False,),
         "select_common_type keeps the first string type; character LIKE sees the padding"),
    Case("case_else_type_comes_first", "CASE WHEN b THEN v ELSE c END LIKE 'ab'", ({"b": "f", "c": "ab  "},),
         (False,), "transformCaseExpr considers the ELSE result's type first"),
    Case("between_bounds_resolve_separately", "i8 BETWEEN f8 AND 9223372036854775806",
         ({"i8": "9223372036854775807", "f8": "0"},), (False,),
         "x >= low and x <= high are separate operators: i8 <= 9223372036854775806 is exact"),
    Case("float8_to_real_underflow_raises", "id = (- (f8)::real)", ({"f8": "5e-324"},), ERROR,
         "float84 raises 'value out of range: underflow'; Spark's cast yields 0"),
    Case("an_error_beside_a_comparison_spark_could_decide", "(n % 0.0) <= CASE WHEN i2 = 12.125::float8 THEN 1 END",
         ({"n": "2.500"},), ERROR,
         "Spark's UnwrapCastInBinaryComparison proved i2 = 12.125 false, the CASE NULL and the comparison NULL, "
         "dropping the division by zero PostgreSQL raises (spark/settings.py EXCLUDED_OPTIMIZER_RULES)"),
    Case("an_overflow_inside_a_comparison_spark_could_decide", "6984328.202 = (- i2)", ({"i2": "-32768"},), ERROR,
         "int2um raises 'smallint out of range'; Spark's UnwrapCastInBinaryComparison decided the comparison "
         "without computing - i2"),
    Case("boolean_in_list_item_keeps_its_parentheses", "(i4 >= 0) IN (t = 'a', '0'::bigint != f8)",
         ({"i4": "1", "t": "b", "f8": "1"},), (True,),
         "an IN item x <> y was generated as b = x <> y, which Spark cannot resolve"),
    Case("is_null_of_a_like", "'' LIKE 'zAb' IS NOT NULL AND t LIKE 'a%' IS NULL", ({"t": "ab"}, {}), (False, True),
         "Spark cannot parse x LIKE y IS NULL without parentheses"),
    Case("date_constant_compared_with_timestamp", "DATE '2000-01-01' <= ts",
         ({"ts": "2000-01-01 00:00:00"}, {"ts": "1999-12-31 23:59:59.999999"}), (True, False),
         "a date constant promoted to timestamp crashed the translation"),
    # Lexical forms (core/filters/pg_lexer.py): the same text goes to the publisher in the copy's pushed-down
    # WHERE, and through our translation to Spark.
    Case("dollar_quoted_string", "t = $$it's$$", ({"t": "it's"}, {"t": "it"}), (True, False),
         "a dollar-quoted string was refused as untranslatable"),
    Case("dollar_quoted_string_with_tag", "t = $q$a$$b$q$", ({"t": "a$$b"}, {"t": "a"}), (True, False),
         "a tagged dollar quote holds $$ as text"),
    Case("e_string_utf8_bytes", r"t = E'\xc3\xa9'", ({"t": "é"}, {"t": "Ã©"}), (True, False),
         "\\x escapes are bytes of UTF-8 (scan.l; core/filters/pg_lexer.py now decodes E'…', not sqlglot)"),
    Case("e_string_escapes", r"t = E'a\tb\'c\q\101\u00e9'", ({"t": "a\tb'cqAé"},), (True,),
         "\\t, \\', an unknown escape, octal and \\u as scan.l decodes them"),
    Case("string_continued_on_the_next_line", "t = 'a'\n  'b'", ({"t": "ab"}, {"t": "a"}), (True, False),
         "a string continues after whitespace holding a newline; sqlglot read two strings"),
    Case("vertical_tab_and_form_feed_are_whitespace", "i4\v>\f1", ({"i4": "2"}, {"i4": "1"}), (True, False),
         "scan.l space (PostgreSQL 16 on) includes \\v and \\f"),
    Case("hexadecimal_integer", "i4 = 0x1F", ({"i4": "31"}, {"i4": "0"}), (True, False),
         "PostgreSQL 16 on reads 0x1F as 31; sqlglot read a hexadecimal string"),
    Case("decimal_with_underscores", "i4 < 1_000", ({"i4": "999"}, {"i4": "1000"}), (True, False),
         "PostgreSQL 16 on reads 1_000 as 1000; sqlglot split it in two"),
    # String functions (varlena.c): zero and negative positions and lengths, NULLs, multibyte text.
    Case("substr_from_zero", "substr(t, 0, 2) = 'a'", ({"t": "abc"}, {"t": ""}, {}), (True, False, None),
         "text_substring counts from max(start, 1) to start + length: substr('abc', 0, 2) is 'a'"),
    Case("substr_negative_length_raises", "substr(t, 1, i4) = 'a'", ({"t": "abc", "i4": "-1"},), ERROR,
         "'negative substring length not allowed', raised when the row is evaluated"),
    Case("substr_negative_length_of_null_is_null", "substr(t, 1, i4) IS NULL", ({"i4": "-1"},), (True,),
         "substr is strict: a NULL string gives NULL before the length is looked at"),
    Case("substr_end_past_int_max", "substr(t, i4, 2147483647) = 'bc'", ({"t": "abc", "i4": "2"},), (True,),
         "start + length overflows int4: PostgreSQL then takes the rest of the string"),
    Case("substring_from_for_multibyte", "substring(t from 2 for 2) = 'é😀'", ({"t": "aé😀b"}, {"t": "ab"}),
         (True, False), "positions count characters, not bytes"),
    Case("substring_without_length", "substring(t, i2) = 'c'", ({"t": "abc", "i2": "3"}, {"t": "abc", "i2": "-5"}),
         (True, False), "text_substr_no_len: from max(start, 1) to the end"),
    Case("substr_of_a_null_start_is_null", "substr(t, i2) IS NULL", ({"t": "ab"},), (True,),
         "Spark's greatest(NULL, 1) is 1, so the whole string came back (differential test)"),
    Case("left_negative", "left(t, i4) = 'ab'", ({"t": "abc", "i4": "-1"}, {"t": "abc", "i4": "2"},
                                                  {"t": "abc", "i4": "-9"}), (True, True, False),
         "left with n < 0 is all but the last |n| characters"),
    Case("right_negative", "right(t, i4) = 'bc'", ({"t": "abc", "i4": "-1"}, {"t": "abc", "i4": "2"},
                                                    {"t": "abc", "i4": "-3"}), (True, True, False),
         "right with n < 0 is all but the first |n| characters"),
    Case("right_of_int_min_is_the_whole_string", "right(t, i4) = t", ({"t": "abc", "i4": "-2147483648"},
                                                                      {"t": "abc", "i4": "-2147483647"}),
         (True, False), "text_right negates n: -INT_MIN stays INT_MIN, and the whole string is kept"),
    Case("strpos_and_position", "strpos(t, v) = position('é' in t)", ({"t": "aé", "v": "é"}, {"t": "", "v": ""},
                                                                       {"t": "x", "v": ""}), (True, False, False),
         "1-based character positions, 1 for an empty needle, 0 when absent"),
    Case("split_part_from_the_end", "split_part(t, ',', i4) = 'c'", ({"t": "a,b,c", "i4": "-1"},
                                                                     {"t": "a,b,c", "i4": "3"},
                                                                     {"t": "a,b,c", "i4": "-4"}),
         (True, True, False), "PostgreSQL 14 on counts a negative field from the end"),
    Case("split_part_of_int_min_is_empty", "split_part(t, v, i4) = ''", ({"t": "_", "v": "", "i4": "-2147483648"},
                                                                       {"t": "a,b", "v": ",", "i4": "-2147483648"}),
         (True, True), "no such field in PostgreSQL; Spark's split_part failed negating INT_MIN (differential test)"),
    Case("constant_call_raises_in_any_branch", "CASE WHEN i4 > 0 THEN substring('ab' FROM 0 FOR -1) = 'a' END",
         ({"i4": "-1"},), ERROR,
         "the planner folds a call of constants wherever it stands, and raises (differential test)"),
    Case("coalesce_after_a_constant_is_not_folded", "starts_with(t, COALESCE('a', substring('ab' FROM 3 FOR -1)))",
         ({"t": "ab"}, {"t": "b"}), (True, False),
         "T_CoalesceExpr drops the arguments after a non-null constant unfolded (differential test)"),
    Case("coalesce_after_a_null_constant_is_folded", "starts_with(t, COALESCE(NULL, substring('ab' FROM 3 FOR -1)))",
         ({"t": "ab"},), ERROR, "a NULL constant is dropped and the next argument folded"),
    Case("case_after_a_true_when_is_not_folded",
         "CASE WHEN true THEN t = 'a' WHEN i4 > 0 THEN substring('ab' FROM 0 FOR -1) = 'a' END",
         ({"t": "a", "i4": "1"}, {"t": "b"}), (True, False), "T_CaseExpr stops at a WHEN that folds to TRUE"),
    Case("case_with_a_false_when_is_not_folded",
         "CASE WHEN false THEN substring('ab' FROM 0 FOR -1) = 'a' ELSE t = 'a' END",
         ({"t": "a"}, {"t": "b"}), (True, False), "T_CaseExpr drops a WHEN that folds to FALSE, its result unfolded"),
    Case("nullif_keeps_the_first_argument_s_integer_type", "NULLIF(i2, i4) * i2 = 0",
         ({"i2": "-32768", "i4": "1"}, {"i2": "2", "i4": "2"}), ERROR,
         "int24eq takes the smallint as it is: the product is int2mul's, which overflows (differential test)"),
    Case("nullif_of_a_literal_takes_the_other_type", "NULLIF('7', i2) + 1 = 8", ({"i2": "1"}, {"i2": "7"}),
         (True, None), "an unknown literal resolves to the other argument's type, as for = (it was text)"),
    Case("nullif_real_against_double_stays_real", "NULLIF(f4, f8) = 0.1::real", ({"f4": "0.1", "f8": "0"},),
         (True,), "float48eq: the real is returned as a real, not widened to double precision"),
    Case("split_part_field_zero_raises", "split_part(t, ',', i4) = 'a'", ({"t": "a", "i4": "0"},), ERROR,
         "'field position must not be zero'"),
    Case("repeat_negative_is_empty", "repeat(t, i4) = ''", ({"t": "ab", "i4": "-1"}, {"t": "ab", "i4": "1"}),
         (True, False), "a negative count repeats nothing"),
    Case("repeat_too_large_raises", "repeat(t, 1073741823) = ''", ({"t": "ab"},), ERROR,
         "'requested length too large' past 1 GB"),
    # x op ANY/ALL (ARRAY[…]) and row tests.
    Case("any_array_compares_in_the_array_type", "i8 = ANY (ARRAY[f8, 9223372036854775806])",
         ({"i8": "9223372036854775807", "f8": "0"},), (True,),
         "the array is double precision[], so i8 is compared as double precision (unlike IN's pairwise items)"),
    Case("all_array_with_null", "i4 <> ALL (ARRAY[1, NULL])", ({"i4": "2"}, {"i4": "1"}, {}), (None, False, None),
         "ALL is false at the first false, else NULL when an element is NULL"),
    Case("all_compared_as_a_boolean", "i4 < ALL (ARRAY[i8]) <= (i2 IS NULL)",
         ({"i4": "1", "i8": "2"}, {"i4": "3", "i8": "2", "i2": "1"}, {"i4": "1", "i8": "2", "i2": "1"}, {"i8": "2"}),
         (True, True, False, None), "(a < ALL (…)) <= b: the quantified comparison is an operand (differential test)"),
    # x [NOT] LIKE|ILIKE ANY/ALL (ARRAY[…]): the pattern operator on each element (PostgreSQL accepts them;
    # they were refused as untranslatable).
    Case("like_any_array", "t LIKE ANY (ARRAY['a%', 'b_'])", ({"t": "abc"}, {"t": "bc"}, {"t": "bcd"}, {}),
         (True, True, False, None), "LIKE ANY was refused as untranslatable"),
    Case("like_any_with_a_null_pattern", "t LIKE SOME (ARRAY['a%', NULL])", ({"t": "abc"}, {"t": "x"}),
         (True, None), "ANY's NULL rule is OR's"),
    Case("not_like_any_negates_each_element", "t NOT LIKE ANY (ARRAY['a%', 'ab%'])",
         ({"t": "abc"}, {"t": "ax"}, {"t": "x"}), (False, True, True), "NOT LIKE ANY is !~~ ANY, not NOT (… ANY)"),
    Case("not_like_all", "t !~~ ALL (ARRAY['a%', 'b%'])", ({"t": "abc"}, {"t": "x"}, {}), (False, True, None),
         "sqlglot reads a LIKE's ALL as exp.All"),
    Case("char_like_all_sees_the_padding", "c LIKE ALL (ARRAY['ab%', t])",
         ({"c": "ab  ", "t": "ab"}, {"c": "ab  ", "t": "ab  "}), (False, True),
         "bpcharlike matches the padded value against each element"),
    Case("ilike_any_folds_ascii_case", "t ILIKE ANY (ARRAY['A%', 'x'])", ({"t": "abc"}, {"t": "X"}, {"t": "b"}),
         (True, True, False), "each element folded as ILIKE folds"),
    Case("date_plus_a_large_integer_is_out_of_range", "d + i4 IS NULL", ({"d": "1999-12-28", "i4": "-2147483647"},),
         ERROR, "Spark's date_add wrapped around in int and landed on a valid date"),
    Case("like_column_pattern_takes_any_escaped_character", "t LIKE v",
         ({"t": "ab", "v": "a\\b"}, {"t": "a%", "v": "a\\%"}, {"t": "ax", "v": "a\\%"},
          {"t": "a\\b", "v": "a\\\\b"}, {"t": "a\\b", "v": "a\\\\\\b"}),
         (True, True, False, True, True), "Spark raised at a backslash before a character other than %, _ or \\"),
    Case("like_any_with_a_column_element", "t LIKE ANY (ARRAY[t, 'x'])", ({"t": "a\\b"}, {"t": "x"}, {"t": "a%"}),
         (False, True, True), "each element a pattern computed per row"),
    Case("any_array_ordering", "i4 < ANY (ARRAY[i2, 5])", ({"i4": "4"}, {"i4": "7", "i2": "8"}, {"i4": "7"}),
         (True, True, None), "each element compared with the operator, ORed"),
    Case("row_is_null", "ROW(i4, t) IS NULL", ({}, {"i4": "1"}), (True, False),
         "ROW IS NULL when every field is NULL"),
    Case("row_is_not_null", "(i4, t) IS NOT NULL", ({"i4": "1", "t": "a"}, {"i4": "1"}, {}), (True, False, False),
         "ROW IS NOT NULL when no field is NULL (so neither test holds for a half-NULL row)"),
    # Row comparisons (parse_expr.c make_row_comparison_op, make_row_distinct_op), refused until 2026-11-27.
    Case("row_equality_is_an_and", "(i4, t) = (1, 'a')", ({"i4": "1", "t": "a"}, {"i4": "1"}, {"i4": "2"}),
         (True, None, False), "= of rows is the AND of the fields' =: NULL only when no field differs"),
    Case("row_inequality_is_an_or", "(i4, t) <> (1, 'a')", ({"i4": "1", "t": "a"}, {"i4": "1"}, {"i4": "2"}),
         (False, None, True), "<> of rows is the OR of the fields' <>"),
    Case("row_ordering_stops_at_the_first_difference", "(i4, t) < (1, 'b')",
         ({"i4": "0"}, {"i4": "1", "t": "a"}, {"i4": "1"}, {"t": "a"}, {"i4": "1", "t": "b"}),
         (True, True, None, None, False),
         "RowCompareExpr: the first unequal pair decides, a NULL before it gives NULL"),
    Case("row_ordering_equal_rows", "ROW(i4, c) <= ROW(1, 'a')", ({"i4": "1", "c": "a   "},), (True,),
         "all pairs equal (character ignoring its padding): the last pair's <="),
    Case("row_ordering_evaluates_both_fields_of_a_pair", "(i4, 1) < (i2 * i2, 2)", ({"i2": "1000"},), ERROR,
         "each pair's fields are evaluated before the NULL test: i2 * i2 overflows though i4 is NULL"),
    Case("row_distinct_compares_pairwise", "(i4, i8) IS DISTINCT FROM (i8, 2)",
         ({"i4": "2", "i8": "2"}, {"i8": "2"}, {}), (False, True, True),
         "IS DISTINCT FROM of rows is the OR of the pairs' IS DISTINCT FROM, each pair in its own type"),
    Case("row_field_of_or_keeps_its_parentheses", "ROW(b OR b) IS NULL", ({"b": "t"}, {}), (False, True),
         "an OR field came out bare, as b OR b IS NULL (sqlglot counts AND and OR as functions)"),
    Case("row_equality_folded_false_skips_a_raising_field", "(0, i4) = (1, 1 / 0)", ({"i4": "1"},), (False,),
         "the planner stops the AND at its constant FALSE before folding 1 / 0"),
    # x op ANY/ALL ('{…}'): array_in reads the literal as the operator's type (refused until 2026-11-27).
    Case("any_over_an_array_literal", "i4 = ANY (' { 1 , \"2\" , NULL } ')", ({"i4": "2"}, {"i4": "3"}, {}),
         (True, None, None), "an untyped '{…}' is int4[] here; a NULL element makes a miss NULL"),
    Case("all_over_an_empty_array_literal", "abs(i8) <> ALL ('{}')",
         ({"i8": "1"}, {"i8": "-9223372036854775808"}), ERROR,
         "an empty array is true for ALL, but x is evaluated first: abs() overflows"),
    Case("any_over_a_two_dimensional_literal", "i8 > ANY ('{{1,5},{9,NULL}}'::int[])", ({"i8": "10"}, {"i8": "0"}),
         (True, None), "every dimension in storage order; int8 > int4 as int84gt"),
    Case("any_over_a_text_literal_unquotes", "t = ANY ('{\"a,b\", c\\\\d, \"NULL\"}')",
         ({"t": "a,b"}, {"t": "c\\d"}, {"t": "NULL"}, {"t": "x"}), (True, True, True, False),
         "quoted elements and backslash escapes as array_in reads them; a quoted NULL is the text NULL"),
    Case("char_any_over_a_literal_ignores_padding", "c = ANY ('{ab}')", ({"c": "ab  "},), (True,),
         "the literal is read as character, compared with bpchareq"),
    Case("like_any_over_a_literal", "t NOT LIKE ALL ('{a%,\"b\\\\_\"}')", ({"t": "abc"}, {"t": "b_"}, {"t": "bx"}),
         (False, False, True), "NOT LIKE ALL is !~~ on each element of the text[] literal"),
    Case("like_any_over_a_text_array_column", "t ILIKE ANY (ta)",
         ({"t": "ABC", "ta": "{x,a%}"}, {"t": "b", "ta": "{x,NULL}"}, {"t": "b", "ta": "{}"}), (True, None, False),
         "LIKE ANY over a column: each element is the pattern (ILIKE folds ASCII under the C collation)"),
    # Array containment and overlap (array.c array_contain_compare), refused until 2026-11-27.
    Case("array_contains_never_matches_a_null_element", "ia @> ARRAY[1, NULL]",
         ({"ia": "{1,2}"}, {"ia": "{1,NULL}"}, {}), (False, False, None),
         "a NULL element matches nothing, so the result is false, never NULL (unless an array is NULL)"),
    Case("array_contained_by_a_literal", "ia <@ '{1,2}'", ({"ia": "{2,1,1}"}, {"ia": "{}"}, {"ia": "{1,3}"},
                                                           {"ia": "{NULL}"}), (True, True, False, False),
         "every element of ia among 1 and 2 (duplicates and order do not matter; an empty array is contained)"),
    Case("text_arrays_overlap", "ta && ARRAY[t, 'x']", ({"ta": "{a,x}"}, {"ta": "{a}", "t": "a"}, {"ta": "{a}"},
                                                        {"ta": "{NULL}", "t": "a"}), (True, True, False, False),
         "some element in common; NULLs match nothing"),
    Case("case_with_equal_results_still_evaluates_its_condition",
         "CASE WHEN t SIMILAR TO '\\)%)' ESCAPE '' THEN TRUE ELSE TRUE END", ({"t": "a"},), ERROR,
         "Spark's SimplifyConditionals made it TRUE without the condition (spark/settings.py EXCLUDED_OPTIMIZER_RULES)"),
    # A per-row pattern ending in a lone backslash: PostgreSQL's error only where MatchText reaches it.
    Case("like_pattern_ending_in_a_backslash_not_reached", "t LIKE v",
         ({"t": "", "v": "\\"}, {"t": "b", "v": "a\\"}, {"t": "a", "v": "a\\"}, {"t": "", "v": "%\\"}),
         (False, False, False, False), "the match fails (or the text ends) before the backslash: false"),
    Case("like_pattern_ending_in_a_backslash_reached", "t LIKE v", ({"t": "ab", "v": "a\\"},), ERROR,
         "text is left when the backslash is reached"),
    Case("like_pattern_ending_in_a_backslash_after_a_wildcard_run", "t NOT LIKE v", ({"t": "a", "v": "%_\\"},),
         ERROR, "the % branch takes the _ and meets the backslash with no text left: it raises there too"),
    # Regular expressions (core/filters/regex.py).
    Case("lower_matches_a_regex", "lower(t) ~ '^z[a-z]+$'", ({"t": "Zab"}, {"t": "zab\n"}, {"t": "z"}, {}),
         (True, False, False, None), "was refused as 'function lower(text, unknown) does not exist'; "
         "Java's $ also matches before a final newline"),
    Case("regex_posix_classes_are_ascii_under_c", "t ~ '^[[:alpha:]][^[:space:]][[:punct:][:digit:]]\\Z'",
         ({"t": "ab!"}, {"t": "éb!"}, {"t": "a 1"}, {"t": "aB7"}, {"t": "ab!\n"}), (True, False, False, True, False),
         "POSIX classes were refused: under C they hold ASCII only, as Java's \\p{…}; \\Z is the very end"),
    Case("regex_dot_matches_newline", "t ~ 'a.b'", ({"t": "a\nb"}, {"t": "ab"}), (True, False),
         "PostgreSQL's . matches a newline (no newline-sensitive flag); Java's needs DOTALL"),
    Case("regex_case_insensitive_ascii_only", "t ~* 'éb'", ({"t": "ÉB"}, {"t": "éB"}), (False, True),
         "~* under the C collation folds ASCII letters only, as Java's (?i) does"),
    Case("regex_negated", "t !~ '[^,]+$'", ({"t": "a,"}, {"t": "a"}), (True, False), "!~ is NOT ~"),
    Case("regex_invalid_raises_for_a_value", "t ~ 'a**'", ({"t": "a"},), ERROR,
         "'invalid regular expression: quantifier operand invalid', raised when the pattern is compiled"),
    Case("regex_invalid_is_null_for_null", "(t ~ 'a**') IS NULL", ({},), (True,),
         "textregexeq is strict: the pattern is never compiled for a NULL value"),
    Case("similar_to", "t SIMILAR TO 'a%' AND t NOT SIMILAR TO 'a.c'", ({"t": "abc"}, {"t": "a.c"}, {"t": "xa"}),
         (True, False, False), "SIMILAR TO matches the whole value; . is a literal dot"),
    Case("similar_to_with_escape", "t SIMILAR TO '#%_*' ESCAPE '#'", ({"t": "%x"}, {"t": "x%"}), (True, False),
         "similar_escape: the escape character makes % literal"),
    Case("invalid_constant_pattern_after_a_constant_true_is_never_folded",
         "('t'::boolean OR ('' SIMILAR TO '\\_)?a')) IS NOT NULL", ({"t": "a"},), (True,),
         "simplify_or_arguments (clauses.c) stops at the first constant TRUE: the pattern is never compiled "
         "(differential test)"),
    Case("invalid_constant_pattern_before_a_constant_true_raises",
         "(('' SIMILAR TO '\\_)?a') OR 't'::boolean) IS NOT NULL", ({"t": "a"},), ERROR,
         "folded in order: the pattern is compiled before the TRUE is met"),
    # Spark's optimizer decided IS [NOT] NULL of what it proved never NULL without computing it, and its / and %
    # computed the divisor first, skipping the dividend after a NULL one (or raising division by zero for a NULL
    # dividend): PostgreSQL computes the operands in order (differential test, docs/row-filters.md)
    Case("is_null_computes_its_operand", "ROW(COALESCE(-2::bigint % i2, NULL, 1.5)) IS NULL", ({"i2": "0"},),
         ERROR, "NullPropagation made IS NULL of a COALESCE ending in a constant FALSE without computing it"),
    Case("is_not_null_computes_its_operand", "(COALESCE(i8, 1) * 816) IS NOT NULL",
         ({"i8": "9223372036854775807"}, {"i8": "2"}), ERROR, "IS NOT NULL was TRUE without the overflow"),
    Case("is_null_of_a_computed_value", "(i4 + 1) IS NULL", ({"i4": "1"}, {}), (False, True),
         "the computed operand's test keeps its NULL rules"),
    Case("modulo_computes_its_dividend_before_a_null_divisor", "((i8 * 816) % position(t IN v)) = 0",
         ({"i8": "9223372036854775807", "t": "a"},), ERROR, "Spark skipped the overflowing dividend"),
    Case("integer_division_computes_its_dividend_before_a_null_divisor", "((i8 * 816) / length(v)) = 0",
         ({"i8": "9223372036854775807"},), ERROR, "Spark skipped the overflowing dividend"),
    Case("float_division_computes_its_dividend_before_a_null_divisor", "((f8 * 1e308::float8) / f4) = 0",
         ({"f8": "1e+308"},), ERROR, "Spark skipped the overflowing dividend"),
    Case("division_of_a_null_dividend_by_zero_is_null", "(i4 / (length(t) - 1)) IS NULL", ({"t": "a"},), (True,),
         "int4div is strict: a NULL dividend is never divided; Spark raised division by zero"),
    Case("modulo_of_a_null_dividend_by_a_null_divisor", "(i4 % i2) IS NULL", ({}, {"i4": "7", "i2": "2"}),
         (True, False), "NULL rules unchanged"),
    # N'…' is a character constant (scan.l xnstart, gram.y ConstCharacter), compared with text after rtrim1
    Case("national_string_is_character", "t = N'ab '", ({"t": "ab"}, {"t": "ab "}), (True, False),
         "N'…' was refused as untranslatable"),
    Case("character_constant_compared_with_text_drops_its_trailing_spaces", "t = 'ab '::bpchar",
         ({"t": "ab"}, {"t": "ab "}), (True, False), "the constant kept its trailing spaces against text"),
    Case("national_string_length", "length(N'ab  ') = 2 AND t || N'c ' = 'xc'", ({"t": "x"},), (True,),
         "character length and the cast to text drop trailing spaces"),
    Case("unicode_identifier", "U&\"\\0074\" = 'a' OR U&\"i\\0034\" = 1", ({"t": "a"}, {"t": "b", "i4": "1"}, {"t": "b"}),
         (True, True, None), "U&\"…\" names were refused: they are decoded as U&'…' strings are"),
    # (a, b) IN ((…), …): transformAExprIn's row comparisons, ORed (not record_eq)
    Case("row_in_a_list_of_rows", "(i4, t) IN ((1, 'a'), (2, 'b'))",
         ({"i4": "1", "t": "a"}, {"i4": "2", "t": "a"}, {"t": "a"}, {"i4": "2", "t": "b"}), (True, False, None, True),
         "rows in IN (…) were refused as untranslatable"),
    Case("row_not_in_a_list_of_rows", "ROW(i4, t) NOT IN (ROW(1, 'a'))", ({"i4": "1", "t": "a"}, {"i4": "1"}),
         (False, None), "a NULL field makes the row comparison NULL"),
    # x ~ ANY/ALL (ARRAY[…]): the operator on each element (translated since 2026-11-27, issue 35)
    Case("regex_any_ors_the_matches", "t ~ ANY (ARRAY['^a', 'b$'])", ({"t": "ax"}, {"t": "xb"}, {"t": "x"}, {}),
         (True, True, False, None), "x ~ ANY (ARRAY[…]) was refused as untranslatable"),
    Case("regex_not_any_is_the_negated_operator_on_each", "t !~ ANY (ARRAY['^a', 'b$'])",
         ({"t": "ab"}, {"t": "a"}, {"t": "x"}), (False, True, True), "t !~ ANY (…) is !~ on each element, "
         "not NOT (t ~ ANY (…)), which sqlglot read"),
    Case("regex_not_before_any_negates_the_whole", "NOT t ~ ANY (ARRAY['^a', 'b$'])", ({"t": "ab"}, {"t": "a"}),
         (False, False), "NOT … ~ ANY is the NOT of the ORed matches"),
    Case("regex_all_with_a_null_element", "t COLLATE \"C\" ~* ALL (ARRAY['A', NULL])", ({"t": "a"}, {"t": "x"}),
         (None, False), "a NULL element makes ALL NULL unless a match fails"),
    Case("regex_any_stops_before_an_invalid_pattern", "t ~ ANY (ARRAY['a', 'a**'])", ({"t": "a"},), (True,),
         "ExecEvalScalarArrayOp stops at the first match: the invalid pattern is never compiled"),
    Case("regex_any_reaches_an_invalid_pattern", "t ~ ANY (ARRAY['a', 'a**'])", ({"t": "b"},), ERROR,
         "no match before it: the invalid pattern is compiled and raises"),
    Case("regex_any_of_a_constant_with_an_invalid_first_pattern", "'a' ~ ANY (ARRAY[NULL, 'a**']) OR t IS NULL",
         ({},), ERROR, "the planner evaluates the constant ScalarArrayOpExpr and raises for every row"),
    Case("unicode_identifier_with_uescape", "U&\"!0074\" UESCAPE '!' = 'a' OR U&\"i#0034\" UESCAPE $$#$$ = 1",
         ({"t": "a"}, {"t": "b", "i4": "1"}, {"t": "b"}), (True, True, None),
         "U&\"…\" UESCAPE 'c' was refused as unreadable: the name is decoded with c as its escape character"),
    Case("regex_code_point_escapes", "t ~ '^\\u00e9\\x41\\U0001F600\\u002e$'", ({"t": "éA😀."}, {"t": "éa😀."}, {"t": "éA😀x"}),
         (True, False, False), "\\u, \\U and \\x were refused: each is the character of its code point"),
    Case("regex_hex_escape_takes_every_hex_digit", "t ~ '^\\x41BC$'", ({"t": "䆼"}, {"t": "ABC"}), (True, False),
         "\\xhhh reads every hexadecimal digit that follows (regc_lex.c lexescape)"),
    # (a, b) = ANY (ARRAY[ROW(…)]): record_eq on each element (translated since 2026-11-27, issue 35)
    Case("row_any_two_nulls_are_equal", "(i4, t) = ANY (ARRAY[ROW(1, NULL::text), ROW(2, 'y'::text)])",
         ({"i4": "1"}, {"i4": "1", "t": "a"}, {"i4": "2", "t": "y"}, {}), (True, False, True, False),
         "(a, b) = ANY (ARRAY[ROW(…)]) was refused: record_eq takes two NULL fields as equal and is never NULL"),
    Case("row_not_all", "(i4, t) <> ALL (ARRAY[ROW(1, 'x'::text)])", ({"i4": "1", "t": "x"}, {"i4": "1", "t": "y"}, {}),
         (False, True, True), "record_ne is NOT record_eq"),
    Case("row_any_unknown_field_raises_when_reached", "(i4, t) = ANY (ARRAY[ROW(1, 'x')])", ({"i4": "1", "t": "x"},),
         ERROR, "'x' stays unknown in ROW(…): record_eq raises when the fields before it are equal"),
    Case("row_any_unknown_field_not_reached", "(i4, t) = ANY (ARRAY[ROW(1, 'x')])", ({"i4": "2", "t": "x"}, {}),
         (False, False), "the first unequal field ends record_eq before the unknown one is checked"),
    Case("row_any_dissimilar_first_field_raises", "(i8, t) = ANY (ARRAY[ROW(1, 'x'::text)])", ({"i8": "5"},), ERROR,
         "bigint against integer: the type is checked before the value"),
    Case("row_any_longer_row_after_a_match", "(i4, t) = ANY (ARRAY[ROW(1, 'x'::text), ROW(2, 'y'::text, 3)])",
         ({"i4": "1", "t": "x"}, {"i4": "3", "t": "x"}), (True, False), "stops at the first match; an unequal first field "
         "ends the longer row's comparison"),
    Case("row_any_longer_row_with_equal_fields_raises", "(i4, t) = ANY (ARRAY[ROW(2, 'y'::text, 3)])",
         ({"i4": "2", "t": "y"},), ERROR, "cannot compare record types with different numbers of columns"),
    Case("row_any_character_ignores_trailing_spaces", "(c, i4) = ANY (ARRAY[ROW('ab'::bpchar, 1)])",
         ({"c": "ab  ", "i4": "1"},), (True,), "bpchareq compares without trailing spaces"),
    Case("invalid_constant_pattern_after_a_constant_false_in_an_and_is_never_folded",
         "('f'::boolean AND ('a' ~ 'a**')) IS NOT NULL", ({"t": "a"},), (True,),
         "simplify_and_arguments stops at the first constant FALSE"),
    # numeric's NaN (storable in numeric(p,s)) and ±Infinity (PostgreSQL 14 on), with numeric.c's rules (issue 49):
    # Spark's DECIMAL holds neither, and the apply's cast raised CAST_INVALID_INPUT for every batch with a NaN
    Case("numeric_nan_sorts_above_every_number", "n >= 0",
         ({"n": "NaN"}, {"n": "1.000"}, {"n": "-1.000"}, {}), (True, True, False, None),
         "cmp_numerics: NaN is above every other value, so NaN >= 0 holds and native replicates the row"),
    Case("numeric_nan_equals_itself", "n = 'NaN'", ({"n": "NaN"}, {"n": "0.000"}), (True, False),
         "numeric_eq: NaN = NaN (unlike IEEE's)"),
    Case("numeric_nan_is_above_infinity", "n > 'Infinity' AND 'Infinity'::numeric > 999999999.999",
         ({"n": "NaN"}, {"n": "999999999.999"}), (True, False),
         "'Infinity' is unconstrained numeric here (no typmod on an operator's literal), above every number, below NaN"),
    Case("numeric_minus_infinity_is_below_every_number", "n > '-Infinity'::numeric AND n > '-inf'",
         ({"n": "-999999999.999"}, {"n": "NaN"}), (True, True), "numeric_in reads -inf as -Infinity"),
    Case("numeric_between_infinities", "n BETWEEN '-Infinity' AND 'Infinity'", ({"n": "5.000"}, {"n": "NaN"}),
         (True, False), "NaN is above Infinity"),
    Case("numeric_between_symmetric_with_nan", "n BETWEEN SYMMETRIC 'NaN' AND 0",
         ({"n": "NaN"}, {"n": "5.000"}, {"n": "-1.000"}), (True, True, False), "both orders, NaN the upper bound"),
    Case("numeric_in_list_with_nan", "n IN (1.5, 'NaN')", ({"n": "NaN"}, {"n": "1.500"}, {"n": "2.000"}),
         (True, True, False), "= ANY (ARRAY[1.5, 'NaN']): NaN equals NaN"),
    Case("numeric_is_distinct_from_nan", "n IS DISTINCT FROM 'NaN'", ({"n": "NaN"}, {}, {"n": "1.000"}),
         (False, True, True), "NaN is not distinct from NaN"),
    Case("numeric_all_over_an_array_literal_with_infinity", "n > ALL ('{1,Infinity}')",
         ({"n": "NaN"}, {"n": "5.000"}), (True, False), "the literal is numeric[], whose Infinity is below NaN"),
    Case("numeric_any_over_an_array_literal_with_nan", "n = ANY ('{NaN,1.5}') AND n <> ALL ('{-inf}')",
         ({"n": "NaN"}, {"n": "1.500"}, {"n": "2.000"}), (True, True, False),
         "an array literal's NaN fits any numeric(p,s): it was refused as having more digits than numeric(12,3)"),
    Case("numeric_any_over_an_array_with_nan", "n = ANY (ARRAY['NaN'::numeric, 2])", ({"n": "NaN"}, {"n": "3.000"}),
         (True, False), "ScalarArrayOpExpr with numeric_eq on each element"),
    Case("numeric_greatest_and_least", "GREATEST(n, 0) = 'NaN' AND LEAST(n, 'Infinity') = n",
         ({"n": "NaN"}, {"n": "5.000"}), (False, False), "GREATEST takes NaN; LEAST(NaN, Infinity) is Infinity"),
    Case("numeric_greatest_of_nan", "GREATEST(n, 0) = 'NaN'", ({"n": "NaN"}, {"n": "5.000"}, {}), (True, False, False),
         "NaN is the greatest; GREATEST ignores NULL"),
    Case("numeric_least_of_minus_infinity", "LEAST(n, '-Infinity') = '-Infinity'", ({"n": "NaN"}, {}), (True, True),
         "-Infinity is the least"),
    Case("numeric_coalesce_nullif_case", "COALESCE(n, 'NaN') = 'NaN' AND NULLIF(n, 'NaN') IS NULL "
         "AND CASE n WHEN 'NaN' THEN 1 END = 1", ({"n": "NaN"}, {}, {"n": "1.000"}), (True, None, False),
         "NaN is one value for COALESCE, NULLIF and CASE alike"),
    Case("numeric_nan_to_integer_raises", "n::int > 0", ({"n": "NaN"},), ERROR,
         "numeric_int4: 'cannot convert NaN to integer'"),
    Case("numeric_to_integer_rounds", "n::int = 3 AND n::smallint = 3 AND n::bigint = 3", ({"n": "2.500"}, {}),
         (True, None), "half away from zero"),
    Case("numeric_infinity_to_bigint_raises", "(n + 'Infinity'::numeric)::bigint > 0", ({"n": "1.000"},), ERROR,
         "numeric_int8: 'cannot convert infinity to bigint'"),
    Case("numeric_infinity_to_integer_of_a_null_is_null", "(n + 'Infinity'::numeric)::int IS NULL", ({},), (True,),
         "strict: a NULL numeric is no infinity"),
    Case("numeric_nan_to_double_precision", "n::float8 = 'NaN'::float8 OR n < f8",
         ({"n": "NaN", "f8": "NaN"}, {"n": "1.000", "f8": "NaN"}, {"n": "1.000", "f8": "1"}, {"n": "NaN", "f8": "1"}),
         (True, True, False, True),
         "numeric_float8: NaN is NaN; float8's NaN is above every double, equal to itself"),
    Case("numeric_nan_to_double_precision_equals", "n::float8 = 'NaN'::float8", ({"n": "NaN"}, {"n": "1.000"}),
         (True, False), "float8eq: NaN = NaN"),
    Case("numeric_infinity_to_double_precision", "(n + 'Infinity'::numeric)::float8 = 'Infinity'::float8 "
         "AND (n - 'Infinity'::numeric)::real < '-3e38'::real", ({"n": "1.000"}, {"n": "NaN"}), (True, False),
         "numeric_float8 and numeric_float4 keep the infinities; NaN + Infinity is NaN"),
    Case("numeric_infinity_arithmetic", "n - 'Infinity'::numeric = '-Infinity' AND n + '-Infinity' < 0",
         ({"n": "1.000"}, {"n": "NaN"}), (True, False), "an infinity absorbs a finite value; NaN stays NaN"),
    Case("numeric_infinity_minus_infinity_is_nan", "(n + 'Infinity'::numeric) - 'Infinity'::numeric = 'NaN'",
         ({"n": "1.000"}, {"n": "NaN"}, {}), (True, True, None), "numeric_sub: Infinity - Infinity is NaN"),
    Case("numeric_infinity_times_zero_is_nan", "(n + 'Infinity'::numeric) * (n - n) = 'NaN' AND n * 0 = 0",
         ({"n": "1.000"}, {"n": "-5.000"}), (True, True), "numeric_mul: Infinity * 0 is NaN"),
    Case("numeric_infinity_times_a_negative", "(n + 'Infinity'::numeric) * -2 = '-Infinity' "
         "AND (n - 'Infinity'::numeric) * (n - 'Infinity'::numeric) = 'Infinity'", ({"n": "1.000"},), (True,),
         "numeric_mul: the sign of the product"),
    Case("numeric_nan_times_anything_is_nan", "n * i4 = 'NaN' AND n * 2.5 = 'NaN'", ({"n": "NaN", "i4": "0"},),
         (True,), "numeric_mul: NaN * 0 is NaN"),
    Case("numeric_modulo_infinity_is_the_dividend", "n % 'Infinity'::numeric = n AND n % '-Infinity' = n",
         ({"n": "999999999.999"}, {"n": "-2.500"}, {"n": "NaN"}), (True, True, True),
         "numeric_mod: x % ±Infinity is x (NaN % Infinity is NaN, which equals n)"),
    Case("numeric_infinity_modulo_is_nan", "(n + 'Infinity'::numeric) % 2 = 'NaN' AND mod(n - 'Infinity', 3) = 'NaN'",
         ({"n": "1.000"},), (True,), "numeric_mod: Infinity % x is NaN"),
    Case("numeric_infinity_modulo_zero_raises", "(n + 'Infinity'::numeric) % 0 = 1", ({"n": "1.000"},), ERROR,
         "numeric_mod: Infinity % 0 is division by zero"),
    Case("numeric_nan_modulo_zero_is_nan", "n % 0 = 'NaN'", ({"n": "NaN"},), (True,),
         "numeric_mod: NaN % 0 is NaN, no error"),
    Case("numeric_constant_nan_modulo_zero_folds", "'NaN'::numeric % 0 = 'NaN' AND n IS NULL", ({},), (True,),
         "the planner folds NaN % 0 to NaN"),
    Case("numeric_abs_neg_round_of_specials", "abs(n - 'Infinity'::numeric) = 'Infinity' AND -n = 'NaN' "
         "AND round(n, 1) = 'NaN' AND round(n) = 'NaN'", ({"n": "NaN"}, {"n": "1.000"}), (False, False),
         "abs, unary minus and round keep NaN; abs(-Infinity) is Infinity"),
    Case("numeric_abs_of_minus_infinity", "abs(n - 'Infinity'::numeric) = 'Infinity' AND -(n - 'Infinity') = "
         "'Infinity' AND round(n + 'Infinity'::numeric, 2) = 'Infinity'", ({"n": "1.000"}, {"n": "NaN"}),
         (True, False), "numeric_abs, numeric_uminus, numeric_round of the infinities"),
    Case("numeric_nan_fits_a_typmod", "n::numeric(20,5) = 'NaN' AND n::decimal(6,1) = 'NaN'", ({"n": "NaN"},),
         (True,), "apply_typmod_special lets NaN through"),
    Case("numeric_infinity_does_not_fit_a_typmod", "(n + 'Infinity'::numeric)::numeric(20,5) > 0",
         ({"n": "1.000"},), ERROR, "apply_typmod_special: 'numeric field overflow'"),
    Case("numeric_infinity_literal_cast_to_a_typmod_raises_for_every_row", "'Infinity'::numeric(5,2) > n OR TRUE",
         ({},), ERROR, "'Infinity'::numeric(5,2) is numeric_in's Infinity under the typmod's cast, which the planner "
         "folds: 'numeric field overflow' (it was refused as invalid input syntax)"),
    Case("numeric_literal_cast_to_a_typmod_overflows_for_every_row", "'123.45'::numeric(3,1) > n OR TRUE", ({},),
         ERROR, "the typmod is a cast the planner folds: the filter is accepted and raises (it was 123.5)"),
    Case("numeric_nan_literal_cast_to_a_typmod", "'NaN'::numeric(5,2) = n", ({"n": "NaN"}, {"n": "1.000"}),
         (True, False), "NaN fits any typmod"),
    Case("numeric_constant_nan_to_integer_raises_for_every_row", "n > 0 OR 'NaN'::numeric::int > 0",
         ({"n": "1.000"},), ERROR, "the planner folds numeric_int4 of the constant: 'cannot convert NaN to integer'"),
    Case("numeric_has_no_negative_zero", "n = '-0' AND n = -0.0 AND -n = 0 AND n::float8 = 0::float8",
         ({"n": "0.000"},), (True,), "'-0'::numeric is 0; numeric_out never prints -0"),
    Case("numeric_at_the_precision_limit", "n + 0.001 > 999999999.999 AND n * n > 0 AND -n = -999999999.999",
         ({"n": "999999999.999"}, {"n": "999999999.998"}), (True, False),
         "the sum needs 13 digits, the product 25: numeric arithmetic has no typmod"),
    Case("numeric_at_the_precision_limit_to_integer_overflows", "(n * 1000)::int > 0", ({"n": "999999999.999"},),
         ERROR, "integer out of range"),
    Case("numeric_row_comparison_with_nan", "(n, i4) = ('NaN', 1) AND (n, i4) > ('Infinity', 0)",
         ({"n": "NaN", "i4": "1"}, {"n": "1.000", "i4": "1"}), (True, False), "each field with numeric_cmp"),
    Case("numeric_record_eq_across_typmods", "(n, t) = ANY (ARRAY[ROW('NaN'::numeric, 'a'::text), "
         "ROW(1.5::numeric(5,1), 'b'::text)])", ({"n": "NaN", "t": "a"}, {"n": "1.500", "t": "b"}, {"n": "1.500"}),
         (True, True, False), "record_eq compares numeric(12,3) with numeric(5,1) as numeric: one Spark struct type"),
    Case("numeric_array_contains_nan", "ARRAY[n, 1.5] @> ARRAY['NaN'::numeric]", ({"n": "NaN"}, {"n": "1.000"}),
         (True, False), "array_contain_compare with numeric_eq: NaN equals NaN"),
    Case("numeric_any_over_an_array_column_with_nan", "n = ANY (na)",
         ({"n": "NaN", "na": "{NaN,1.50}"}, {"n": "1.500", "na": "{NaN,1.50}"}, {"n": "2.000", "na": "{1.00,NULL}"},
          {"n": "2.000", "na": "{NaN}"}), (True, True, None, False),
         "array_out prints NaN unquoted; each element read as numeric(6,2)'s struct, widened to n's"),
    Case("numeric_all_over_an_array_column_with_nan", "n > ALL (na) AND 'NaN'::numeric >= ALL (na)",
         ({"n": "NaN", "na": "{1.00,-9999.99}"}, {"n": "NaN", "na": "{NaN}"}, {"n": "5.000", "na": "{9999.99}"}),
         (True, False, False), "NaN > NaN is false"),
    Case("numeric_array_column_contains_nan", "na @> ARRAY['NaN'::numeric] AND na && '{NaN,7}'",
         ({"na": "{NaN,1.50}"}, {"na": "{1.50}"}, {"na": "{NULL}"}), (True, False, False),
         "array_contain_compare across typmods (numeric(6,2) and numeric(1,0)): one Spark struct type"),
)

VALIDITY = (
    # (id, filter, our verdict: "accepted" / InvalidRowFilterError / UntranslatableFilterError)
    ("varchar_in_constant_list_is_rejected", "v IN ('a', 'b')", InvalidRowFilterError),
    ("text_in_constant_list_is_fine", "t IN ('a', 'b')", "accepted"),
    ("varchar_in_list_with_a_column_is_fine", "v IN (t, 'a')", "accepted"),
    ("explicit_varchar_cast_of_a_long_literal", "'abcdef'::varchar(3) = t", "accepted"),
    ("explicit_char_cast_of_a_column", "(t)::char(3) = c", "accepted"),
    ("char_column_coalesced_with_a_long_literal", "COALESCE(c, 'abcdef') = t", "accepted"),
    ("typed_constant_cast_out_of_range", "(-32768)::int2 < 32768::int2", "accepted"),
    ("timestamptz_literal_before_year_1_in_utc", "tz > '0001-01-01 00:00:00+02'::timestamptz",
     UntranslatableFilterError),
    ("float_constant_cast_to_integer", "'6.6e16'::real::integer = i4", "accepted"),
    ("numeric_compared_with_an_integer_array", "n = ANY (ARRAY[1, 2])", InvalidRowFilterError),
    ("varchar_compared_with_a_text_array", "v = ANY (ARRAY['a', 'b'])", "accepted"),
    # no operator takes varchar: a varchar[] array is converted to text[] (an ArrayCoerceExpr)
    ("varchar_compared_with_its_own_array", "v = SOME (ARRAY[v, '''', 'a A'''])", InvalidRowFilterError),
    ("varchar_ordered_against_a_varchar_array", "v < ALL (ARRAY[v])", InvalidRowFilterError),
    ("text_compared_with_a_varchar_array", "t = ANY (ARRAY[v, 'y'])", InvalidRowFilterError),
    ("varchar_compared_with_a_text_column_array", "v = ANY (ARRAY[t, 'y'])", "accepted"),
    ("char_compared_with_its_own_array", "c = ANY (ARRAY[c, 'y'])", "accepted"),
    # LIKE ANY: the elements are the operator's text argument, so a varchar[] or character(n)[] array is converted
    ("unicode_escape_lone_high_surrogate", "t = U&'\\D83D'", InvalidRowFilterError),
    ("unicode_escape_lone_low_surrogate", "t = U&'\\DE00x'", InvalidRowFilterError),
    ("unicode_escape_too_short", "t = U&'\\00'", InvalidRowFilterError),
    ("unicode_escape_zero", "t = U&'\\0000'", InvalidRowFilterError),
    ("unicode_escape_beyond_unicode", "t = U&'\\+110000'", InvalidRowFilterError),
    ("unicode_escape_character_is_a_hex_digit", "t = U&'a' UESCAPE 'a'", InvalidRowFilterError),
    ("unicode_escape_doubled_escape", "t = U&'\\\\'", "accepted"),
    ("array_contains_of_other_element_types", "ia @> ARRAY[i8]", InvalidRowFilterError),
    ("array_contains_of_text_and_varchar", "ta @> ARRAY[v]", InvalidRowFilterError),
    ("array_overlap_with_an_empty_array", "ia && ARRAY[]", InvalidRowFilterError),
    ("array_literal_malformed", "i4 = ANY ('{1,2')", InvalidRowFilterError),
    ("array_literal_uneven_dimensions", "i4 = ANY ('{{1,2},{3}}')", InvalidRowFilterError),
    ("array_literal_element_beside_a_sub_array", "i4 = ANY ('{1,{2}}')", InvalidRowFilterError),
    ("array_literal_junk_after_a_quoted_element", "t = ANY ('{\"a\" b}')", InvalidRowFilterError),
    ("array_literal_empty_element", "t = ANY ('{a,,b}')", InvalidRowFilterError),
    ("array_literal_bad_integer", "i4 = ANY ('{1,x}')", InvalidRowFilterError),
    ("array_literal_with_bounds", "i4 = ANY ('[0:1]={1,2}')", UntranslatableFilterError),
    ("array_literal_finer_than_the_numeric_column", "n = ANY ('{1.2345}')", UntranslatableFilterError),
    ("array_literal_of_the_numeric_column_scale", "n = ANY ('{1.5, -2}')", "accepted"),
    ("varchar_compared_with_an_array_literal", "v = ANY ('{a,b}')", "accepted"),
    ("row_comparison_of_unequal_rows", "(i4, t) = (1, 'a', 2)", InvalidRowFilterError),
    ("row_comparison_with_a_mismatched_field", "(i4, t) < (1, 2)", InvalidRowFilterError),
    ("row_ordering_of_text_under_c", "(t, i4) >= ('a', 1)", "accepted"),
    ("row_compared_with_a_row_inside", "(i4, (t, v)) = (1, ('a', 'b'))", UntranslatableFilterError),
    ("parameter_is_an_error", "i4 = $1", InvalidRowFilterError),
    ("like_any_over_a_text_array_column", "t LIKE ALL (ta)", "accepted"),
    ("like_any_over_an_integer_array_column", "t LIKE ANY (ia)", InvalidRowFilterError),
    ("like_any_over_a_varchar_array", "t LIKE ANY (ARRAY['a%', v])", InvalidRowFilterError),
    ("like_any_over_a_char_array", "t LIKE ANY (ARRAY[c])", InvalidRowFilterError),
    ("varchar_ilike_any_over_text", "v ILIKE ANY (ARRAY['a%'])", "accepted"),
    ("integer_like_any", "i4 LIKE ANY (ARRAY['1'])", InvalidRowFilterError),
    ("text_like_any_integers", "t LIKE ANY (ARRAY[1])", InvalidRowFilterError),
    ("like_any_with_escape_is_a_syntax_error", "t LIKE ANY (ARRAY['a%']) ESCAPE '!'", PublicationError),
    ("regex_any_over_a_varchar_array", "t ~ ANY (ARRAY[v])", InvalidRowFilterError),
    ("integer_regex_any", "i4 ~ ANY (ARRAY['1'])", InvalidRowFilterError),
    ("regex_any_over_text", "t ~ ANY (ARRAY['a', 'b'])", "accepted"),
    ("regex_not_all_over_text", "t !~* ALL (ARRAY['a', t])", UntranslatableFilterError),
    ("regex_any_over_a_text_array_column", "t ~ ANY (ta)", UntranslatableFilterError),
    ("regex_any_with_a_back_reference", "t ~ ANY (ARRAY['(a)\\1'])", UntranslatableFilterError),
    ("unicode_identifier_with_uescape", "U&\"!0074\" UESCAPE '!' = 'a'", "accepted"),
    ("unicode_identifier_uescape_of_a_number", "U&\"!0074\" UESCAPE 1 = 'a'", PublicationError),
    ("unicode_identifier_uescape_of_a_hex_digit", "U&\"a0074\" UESCAPE 'a' = 'a'", PublicationError),
    ("unicode_identifier_uescape_of_two_characters", "U&\"!0074\" UESCAPE '!!' = 'a'", PublicationError),
    ("similar_to_any_is_a_syntax_error", "t SIMILAR TO ANY (ARRAY['a%'])", PublicationError),
    ("not_similar_to_all_is_a_syntax_error", "t NOT SIMILAR TO ALL (ARRAY['a%'])", PublicationError),
    ("like_any_then_in_parses", "t LIKE ANY (ARRAY['a%']) IN (true)", "accepted"),
    # `op ANY/ALL (…)` reduces with Op's precedence, so a comparison may follow it (differential test),
    # but not precede it: `a <= b < ALL (…)` chains two comparisons
    ("all_then_a_comparison_parses", "i4 < ALL (ARRAY[i8]) <= (i2 IS NOT DISTINCT FROM length(v))", "accepted"),
    ("any_then_any_parses", "i4 = ANY (ARRAY[i8]) = ANY (ARRAY[b])", "accepted"),
    ("a_comparison_then_all_is_a_syntax_error", "i4 <= i8 < ALL (ARRAY[i2])", PublicationError),
    ("all_then_two_comparisons_is_a_syntax_error", "i4 < ALL (ARRAY[i8]) = b < true", PublicationError),
    # sqlglot nests `a = b < c` to the right (< binds tighter there); PostgreSQL has one level
    ("equality_then_an_ordering_is_a_syntax_error", "b = i4 < 3", PublicationError),
    ("inequality_then_an_ordering_is_a_syntax_error", "b <> (i4) >= 3", PublicationError),
    # ANY (…) is only the right operand of an operator (gram.y subquery_Op): sqlglot read these as a call of any()
    ("any_inside_a_parenthesis_is_a_syntax_error", "t = (ANY (ta) >= TRUE)", PublicationError),
    ("any_as_a_function_argument_is_a_syntax_error", "COALESCE(ANY (ta)) = t", PublicationError),
    ("any_after_not_is_a_syntax_error", "NOT ANY (ARRAY[b])", PublicationError),
    ("any_after_an_arithmetic_operator_is_not_boolean", "(i4 + ANY (ia))", InvalidRowFilterError),
    # || with an array: array_append / array_prepend / array_cat (IMMUTABLE), typed; Spark does not evaluate it
    ("array_append", "i4 = ANY (ia || 1)", UntranslatableFilterError),
    ("array_prepend_of_a_smallint", "i4 = ANY (2::smallint || ia)", UntranslatableFilterError),
    ("array_cat_of_a_literal", "i4 = ANY (ia || '{1,NULL}')", UntranslatableFilterError),
    ("array_cat_contains", "(ia || ia) @> ia", UntranslatableFilterError),
    ("array_append_of_a_malformed_literal", "i4 = ANY (ia || '1')", InvalidRowFilterError),
    ("array_append_of_text_to_integers", "i4 = ANY (ia || t)", InvalidRowFilterError),
    ("array_append_converting_the_array", "i8 = ANY (ia || i8)", InvalidRowFilterError),
    ("unicode_identifier_with_a_bad_escape", 'U&"\\00" = \'a\'', PublicationError),
    ("unicode_identifier_of_no_column", 'U&"\\0078" = 1', InvalidRowFilterError),
    ("national_string_compared_with_an_integer", "i4 = N'1'", InvalidRowFilterError),
    ("row_in_a_list_of_longer_rows", "(i4, t) IN ((1, 'a', 3))", InvalidRowFilterError),
    # numeric_in's special values (PostgreSQL 14 on): NaN has no sign; Python's Decimal reads more
    ("numeric_signed_nan_is_invalid", "n = '-NaN'::numeric", InvalidRowFilterError),
    ("numeric_signaling_nan_is_invalid", "n = 'sNaN'", InvalidRowFilterError),
    ("numeric_nan_with_digits_is_invalid", "n = 'NaN1'", InvalidRowFilterError),
    ("numeric_of_non_ascii_digits_is_invalid", "n = '\u0663'", InvalidRowFilterError),
    ("numeric_infinity_spellings", "n < ' +inf ' AND n > '-INFINITY'::numeric", "accepted"),
    ("numeric_infinity_under_a_typmod_is_accepted", "'Infinity'::numeric(5,2) > n", "accepted"),
    ("numeric_literal_with_more_digits_than_the_column", "n = '1.2345'", UntranslatableFilterError),
    ("numeric_literal_beyond_the_column_precision", "n < '1000000000'", UntranslatableFilterError),
    ("numeric_literal_at_the_column_limits", "n BETWEEN '-999999999.999' AND '999999999.999'", "accepted"),
)


def _text_rows(rows: tuple[dict[str, str], ...]) -> list[ft.TextRow]:
    return [(str(i), *(row.get(n) for n in ft.DATA_COLUMNS)) for i, row in enumerate(rows, start=1)]


@pytest.fixture(scope="module")
def cases_conn(local_pg) -> Iterator[psycopg.Connection]:
    dsn = local_pg.create_database("rowfilter_translation_cases")
    with psycopg.connect(dsn, autocommit=True) as conn:
        ft.create_table(conn)
        yield conn
    local_pg.drop_database("rowfilter_translation_cases")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_postgres_gives_the_expected_result(cases_conn: psycopg.Connection, case: Case) -> None:
    printed = ft.insert_text_rows(cases_conn, list(case.rows))
    assert printed == _text_rows(case.rows), "the case's rows must be PostgreSQL's own text output"
    assert ft.pg_accepts_filter(cases_conn, case.filter) is None
    outcome = ft.pg_evaluate(cases_conn, case.filter)
    if case.expected == ERROR:
        assert outcome.failed, outcome
    else:
        assert outcome.values == case.expected, outcome


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_spark_translation_gives_the_postgres_result(spark, case: Case) -> None:
    spark_sql = to_spark_sql(validate_row_filter(case.filter, ft.RELATION))
    outcome = ft.spark_evaluate(ft.spark_frame(spark, _text_rows(case.rows)), [spark_sql])[0]
    if case.expected == ERROR:
        assert outcome.failed, f"{spark_sql} gave {outcome.values}, PostgreSQL raises"
    else:
        assert outcome.values == case.expected, f"{spark_sql}: {outcome}"


@pytest.mark.parametrize("case_id, filter_sql, verdict", VALIDITY, ids=[v[0] for v in VALIDITY])
def test_validator_agrees_with_postgres_on_validity(
    cases_conn: psycopg.Connection, case_id: str, filter_sql: str, verdict: object
) -> None:
    pg_error = ft.pg_accepts_filter(cases_conn, filter_sql)
    if verdict == "accepted":
        assert pg_error is None
        validate_row_filter(filter_sql, ft.RELATION)
    elif verdict is UntranslatableFilterError:
        assert pg_error is None
        with pytest.raises(UntranslatableFilterError):
            validate_row_filter(filter_sql, ft.RELATION)
    else:
        assert pg_error is not None
        with pytest.raises(PublicationError) as raised:
            validate_row_filter(filter_sql, ft.RELATION)
        assert isinstance(raised.value, verdict)
        assert pg_error.split(": ", 1)[1] == raised.value.message


# What we refuse although PostgreSQL accepts it must say why, name the construct and give a fix
# (never "function lower(text, unknown) does not exist" for an operator).
REFUSALS = (
    ("t ~ '\\y'", "the escape \\y"),
    ("lower(t) ~ 'a\\mb'", "the escape \\m"),
    ("t ~ 'a(?=b)'", "lookaround constraints"),
    ("t ~* '[[:alpha:]]'", "the class [:alpha:] in a case-insensitive match"),
    ("t ~ '(a)\\1'", "the escape \\1"),
    ("t ~ v", "a pattern that is not a constant"),
    ("t ~* '[^a]'", "a negated bracket expression in a case-insensitive match"),
    ("t SIMILAR TO '[[.a.]]%'", "SIMILAR TO with collating elements"),
    ("ROW(ROW(i4), t) IS NULL", "a row inside a row"),
    ("(i4, t) < ANY (ARRAY[(1, 'a')])", "a row < ANY (…) other than = or <>"),
    ("(i4, t) = ANY (ARRAY[(i4 + 1, 'a')])", "a computed field of a row under ANY/ALL"),
    ("i4 = ANY ('[0:1]={1,2}')", "an array literal with explicit bounds"),
    ("n = ANY ('{1.2345}')", "an array constant with more digits than numeric(12,3)"),
    ("n = '1.2345'", "the numeric literal 1.2345 compared as numeric(12,3)"),
    ("sign(n) = 1", "function sign()"),
    ("i4 = ANY (NULLIF(ia, ia))", "comparing arrays"),
    ("t ~ ANY (ta)", "a regular expression ANY over an array column"),
    # array_eq / array_cmp (arrayfuncs.c) compare the dimensions and lower bounds too ('{{1,2}}' = '{1,2}' and
    # '[0:1]={1,2}' = '{1,2}' are false), which the flattened Spark array loses: Spark's = said true
    ("ia = '{1,2}'", "comparing arrays"),
    ("ia IS DISTINCT FROM '{1}'", "comparing arrays"),
    ("ta < '{a}'", "comparing arrays"),
    ("ia IN ('{1}', '{2}')", "comparing arrays"),
    ("NULLIF(ia, '{1,2}') IS NULL", "comparing arrays"),
    ("GREATEST(ia, '{1}') @> '{1}'", "comparing arrays"),
    ("CASE ia WHEN '{1}' THEN b END", "comparing arrays"),
    ("(ia, i4) = ANY (ARRAY[ROW('{1}'::int[], 1)])", "comparing arrays"),
    ("(ia, i4) IN (('{1}'::int[], 1))", "comparing arrays"),
)


def test_a_constant_pattern_match_that_decides_whether_an_invalid_pattern_is_compiled_is_refused() -> None:
    """The planner folds ``'a' ~ ANY (ARRAY['b', 'a**'])``: whether it compiles ``a**`` (and raises for every row)
    depends on whether ``'a' ~ 'b'`` matches, which is not computed here."""
    with pytest.raises(UntranslatableFilterError) as raised:
        to_spark_sql(validate_row_filter("'a' ~ ANY (ARRAY['b', 'a**']) OR t IS NULL", ft.RELATION))
    assert "a constant condition that decides whether" in raised.value.message


@pytest.mark.parametrize("filter_sql, reason", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal_names_the_reason(cases_conn: psycopg.Connection, filter_sql: str, reason: str) -> None:
    assert ft.pg_accepts_filter(cases_conn, filter_sql) is None
    with pytest.raises(UntranslatableFilterError) as raised:
        validate_row_filter(filter_sql, ft.RELATION)
    assert reason in raised.value.message, raised.value.message
    assert raised.value.hint
