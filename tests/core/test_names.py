"""Names in the spec and on the command line, read as PostgreSQL reads SQL identifiers (scan.l)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.relation import TableName, table_names
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec


def spec(*publications: str) -> SubscriptionSpec:
    return SubscriptionSpec.from_dict({"subscription": "s1", "publications": list(publications)})


def test_unquoted_publication_names_fold_to_lower_case_and_quoted_ones_keep_their_case():
    s = spec("pA", '"QuotedPub"', '"with ""quote"" and space"', "plain_1$", "ÄpX")
    assert s.publication_names == ("pa", "QuotedPub", 'with "quote" and space', "plain_1$", "Äpx")
    # What the spec holds reads back the same, through JSON (the jobs' --spec-json) and a copy.
    assert SubscriptionSpec.from_json(s.to_json()).publication_names == s.publication_names
    assert json.loads(s.to_json())["publications"][:2] == ["pa", '"QuotedPub"']
    assert SubscriptionSpec.from_dict({"subscription": "s1", "publications": list(s.publications)}) == s


def test_a_name_longer_than_63_bytes_is_truncated_as_postgresql_truncates_it():
    assert spec("P" * 70).publication_names == ("p" * 63,)
    assert spec('"' + "é" * 40 + '"').publication_names == ("é" * 31,)  # 62 bytes: not in the middle of a character


@pytest.mark.parametrize(("names", "message"), [
    (["pA", "pa"], 'publication name "pa" used more than once'),
    (["my pub"], "'my pub' is not a name as SQL reads it"),
    (['""'], "zero-length delimited identifier"),
    (["a.b"], "'a.b' is not one name"),
    (['"open'], "'\"open' is not a name as SQL reads it"),
])
def test_names_postgresql_would_not_read_are_refused_with_the_fix(names, message):
    with pytest.raises(SpecError, match="publications|publication name") as raised:
        spec(*names)
    assert message in str(raised.value)


def test_table_names_on_the_command_line_follow_the_same_rules():
    assert TableName.from_sql("Sales.Orders") == TableName("sales", "orders")
    assert TableName.from_sql('"Sales"."Or.ders"') == TableName("Sales", "Or.ders")
    assert TableName.from_sql("T1") == TableName("public", "t1")
    assert TableName.from_sql(' public . "T1" ') == TableName("public", "T1")
    assert TableName.from_sql(TableName("Sales", "my table").as_sql()) == TableName("Sales", "my table")
    assert table_names('T1, "T2"') == [TableName("public", "T2"), TableName("public", "t1")]
    with pytest.raises(SpecError, match="is not a table name"):
        TableName.from_sql("a.b.c")
    with pytest.raises(SpecError, match="tables: 'a..b' is not a table name"):
        table_names(["a..b"])
