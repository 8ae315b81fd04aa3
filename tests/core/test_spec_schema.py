"""The spec's schema: every key type-checked, each bad value refused naming the file, the key, the value
and the fix; a password in any form of connection string refused without showing it."""

from __future__ import annotations

import traceback
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

SECRET = "hunter2-Zk8q"
BASE = "subscription: s1\npublications: [p1]\n"


def traceback_text(error: BaseException) -> str:
    """What a traceback of ``error`` prints, its causes and contexts included."""
    return "".join(traceback.format_exception(error))


def load(tmp_path: Path, text: str) -> SubscriptionSpec:
    path = tmp_path / "s1.yaml"
    path.write_text(text)
    return SubscriptionSpec.load(path)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("subscription: 123\npublications: [p1]\n", "subscription=123 is not a string", id="subscription-int"),
    pytest.param("subscription: s1\npublications: 5\n", "publications=5 is not a list of publication names",
                 id="publications-int"),
    pytest.param("subscription: s1\npublications: {p1: 1}\n",
                 "publications={'p1': 1} is not a list of publication names", id="publications-mapping"),
    pytest.param("subscription: s1\npublications: [p1, 2]\n",
                 "publications=['p1', 2] is not a list of publication names", id="publications-not-names"),
    pytest.param(BASE + "copy_data: 'false'\n", "copy_data='false' is not true or false\nHINT:  write copy_data: "
                 "true or copy_data: false, without quotes", id="copy-data-string"),
    pytest.param(BASE + "copy_data: 0\n", "copy_data=0 is not true or false", id="copy-data-int"),
    pytest.param(BASE + "schema_changes: replicate\n",
                 "schema_changes='replicate' is not one of stop, follow, follow_drops\nHINT:  stop (PostgreSQL's "
                 "behaviour", id="schema-changes-unknown"),
    pytest.param(BASE + "schema_changes: true\n", "schema_changes=True is not one of stop, follow, follow_drops",
                 id="schema-changes-bool"),
    pytest.param(BASE + "conflict_policy: merge\n", "conflict_policy='merge' is not one of error, upsert",
                 id="conflict-policy"),
    pytest.param(BASE + "spark_conf: [a]\n", "spark_conf=['a'] is not a mapping of Spark settings", id="conf-list"),
    pytest.param(BASE + "spark_conf: {spark.x: [1]}\n", "spark_conf={'spark.x': [1]} is not a mapping of Spark",
                 id="conf-value-list"),
    pytest.param(BASE + "spark_conf: {spark.x: {a: 1}}\n", "is not a mapping of Spark settings", id="conf-value-map"),
    pytest.param(BASE + "spark_conf: {spark.x: }\n", "spark_conf={'spark.x': None} is not a mapping",
                 id="conf-value-null"),
    pytest.param(BASE + "spark_conf: {1: a}\n", "spark_conf={1: 'a'} is not a mapping", id="conf-key-int"),
    pytest.param(BASE + "retained_wal_warning: lots\n", "'lots' is not a size", id="wal-warning-text"),
    pytest.param(BASE + "retained_wal_warning: true\n", "retained_wal_warning=True is not a size", id="wal-warning-bool"),
    pytest.param(BASE + "retained_wal_warning: -5\n", "retained_wal_warning of subscription 's1' = -5 is not a size",
                 id="wal-warning-negative"),
    pytest.param(BASE + "logical_decoding_work_mem: true\n", "logical_decoding_work_mem=True is not a size",
                 id="decoding-work-mem-bool"),
    pytest.param(BASE + "logical_decoding_work_mem: 256mb\n",
                 "logical_decoding_work_mem of subscription 's1': invalid value for parameter "
                 '"logical_decoding_work_mem": "256mb"', id="decoding-work-mem-unit-case"),
    pytest.param(BASE + "logical_decoding_work_mem: 32kB\n",
                 '32 kB is outside the valid range for parameter "logical_decoding_work_mem" (64 kB .. 2147483647 kB)',
                 id="decoding-work-mem-below-64kB"),
    pytest.param(BASE + "spec_version: 2\n", "spec_version=2 is not supported (expected 1)", id="spec-version"),
    pytest.param(BASE + "spec_version: true\n", "spec_version=True is not supported", id="spec-version-bool"),
    pytest.param(BASE + "spark_master: 4\n", "spark_master=4 is not a string", id="spark-master-int"),
    pytest.param(BASE + "publisher_conn_id: [a]\n", "publisher_conn_id=['a'] is not a string", id="conn-id-list"),
    pytest.param(BASE + "publications_ddl: 5\n", "publications_ddl=5 is not a string", id="ddl-int"),
    pytest.param(BASE + "publisher: 5\n", "publisher=<int> is not a connection string", id="publisher-int"),
    pytest.param(BASE + f"publisher: {{host: h, password: {SECRET}}}\n", "publisher=<dict> is not a connection string",
                 id="publisher-mapping"),
    pytest.param(BASE + "slot: x\n",
                 "unknown key 'slot'\nHINT:  known keys: apply_schedule, change_log, change_log_conn_id, conflict_log, "
                 "conflict_policy",
                 id="unknown-key"),
    pytest.param("publications: [p1]\n", "missing key 'subscription'", id="missing-subscription"),
    pytest.param("subscription: s1\n", "subscription 's1' names no publications", id="missing-publications"),
    pytest.param("subscription: S1\npublications: [p1]\n", "subscription name 'S1' is not a valid PostgreSQL name",
                 id="bad-name"),
    pytest.param(f"subscription: s1\npublications: [p1]\npublisher: postgresql://u:{SECRET}@h/db: x\n",
                 "is not valid YAML: mapping values are not allowed here at line 3", id="yaml-error-no-snippet"),
])
def test_bad_value_is_refused_naming_file_key_value_and_fix(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as e:
        load(tmp_path, text)
    message = str(e.value)
    assert expected in message
    assert str(tmp_path / "s1.yaml") in message
    assert SECRET not in traceback_text(e.value)


@pytest.mark.parametrize(("publisher", "key"), [
    pytest.param(f"postgresql://u:{SECRET}@h/db", "password (user:password@ in the URL)", id="url-user-info"),
    pytest.param(f"postgresql://u@h/db?password={SECRET}", "password (the URL query parameter 'password')",
                 id="url-query"),
    pytest.param(f"postgresql://u@h/db?sslmode=disable&pass%77ord={SECRET}",
                 "password (the URL query parameter 'password')", id="url-query-percent-encoded"),
    pytest.param(f"'host=h user=u password={SECRET}'", "password (the key 'password')", id="key-value"),
    pytest.param(f"\"host=h password='{SECRET} x'\"", "password (the key 'password')", id="key-value-quoted"),
    pytest.param(f"'host=h sslpassword={SECRET}'", "sslpassword (the key 'sslpassword')", id="sslpassword"),
])
@pytest.mark.parametrize("role", ["publisher", "subscriber"])
def test_a_password_in_any_form_is_refused(tmp_path: Path, publisher: str, key: str, role: str) -> None:
    with pytest.raises(SpecError) as e:
        load(tmp_path, BASE + f"{role}: {publisher}\n")
    message = traceback_text(e.value)
    assert f"the {role} of subscription 's1' carries a {key}" in message
    assert SECRET not in message and "********" in message
    if key.startswith("password"):
        assert f"PGPASSWORD or ~/.pgpass (the rowfilter command), ROWFILTER_{role.upper()}_PASSWORD (a job)" in message
        assert "Airflow connection" in message


@pytest.mark.parametrize("publisher", [
    pytest.param(f"postgresql://u:{SECRET}@[::1/db", id="unclosed-ipv6"),
    pytest.param(f"postgresql://u:{SECRET}@h/db?application_name=a b", id="space-in-url"),
    pytest.param(f"postgresql://u:{SECRET}%G1@h/db", id="bad-percent"),
])
def test_a_malformed_url_with_a_password_is_refused_without_it(tmp_path: Path, publisher: str) -> None:
    with pytest.raises(SpecError, match="the publisher of subscription 's1' is not a valid connection string") as e:
        load(tmp_path, BASE + f"publisher: '{publisher}'\n")
    assert SECRET not in traceback_text(e.value)


def test_keyword_construction_and_the_json_boundary_are_checked_too() -> None:
    spec = SubscriptionSpec(subscription="s1", publications=("p1",), publisher="postgresql://u@h/db")
    with pytest.raises(SpecError, match="carries a password"):
        replace(spec, subscriber=f"host=h password={SECRET}")
    with pytest.raises(SpecError, match="spec JSON: copy_data='no' is not true or false"):
        SubscriptionSpec.from_json(spec.to_json().replace('"copy_data": true', '"copy_data": "no"'))
    with pytest.raises(SpecError, match="the spec JSON is not valid JSON"):
        SubscriptionSpec.from_json("{")


def test_what_stays_accepted(tmp_path: Path) -> None:
    spec = load(tmp_path, "subscription: s1\npublications: p1\ncopy_data: false\nconflict_policy: upsert\n"
                "retained_wal_warning: 512MB\nlogical_decoding_work_mem: 1GB\n"
                "spark_conf: {spark.executor.cores: 2, spark.sql.adaptive.enabled: true, "
                "spark.memory.fraction: 0.5, spark.app.name: x}\npublisher: postgresql://u@h:5432/db?sslmode=require\n"
                "subscriber: host=h user=u dbname=d\n")
    assert spec.publications == ("p1",)  # one name is one publication
    assert spec.copy_data is False and spec.conflict_policy == "upsert"
    assert spec.schema_changes == "stop"  # PostgreSQL's behaviour unless asked
    assert spec.spark_conf == {"spark.executor.cores": "2", "spark.sql.adaptive.enabled": "true",
                               "spark.memory.fraction": "0.5", "spark.app.name": "x"}
    assert spec.retained_wal_warning_bytes == 512 << 20
    assert spec.decoding_work_mem_kb == 1 << 20
    assert SubscriptionSpec.from_json(spec.to_json()) == spec


# --- filtering: who evaluates the publications (docs/change-log.md, "Two capture modes") -------------
@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(BASE + "filtering: publisher\n", "filtering='publisher' is not one of auto, source, spark",
                 id="filtering-unknown"),
    pytest.param(BASE + "filtering: true\n", "filtering=True is not one of auto, source, spark", id="filtering-bool"),
])
def test_filtering_refuses_other_values(tmp_path, text, expected):
    with pytest.raises(SpecError, match="filtering") as caught:
        load(tmp_path, text)
    assert expected in str(caught.value)


def test_filtering_source_with_a_publications_file_is_refused_naming_the_setting(tmp_path):
    (tmp_path / "pubs.sql").write_text("CREATE PUBLICATION p1 FOR TABLE t;")
    with pytest.raises(SpecError) as caught:
        load(tmp_path, BASE + "publications_ddl: pubs.sql\nfiltering: source\n")
    text = str(caught.value)
    assert "filtering=source is not possible" in text and "publications_ddl" in text and "filtering: auto" in text


@pytest.mark.parametrize(("filtering", "ddl", "version", "mode"), [
    ("auto", False, 180000, "source"), ("auto", False, 150000, "source"), ("auto", False, 140000, "spark"),
    ("auto", True, 180000, "spark"), ("spark", False, 180000, "spark"), ("source", False, 150000, "source"),
    ("spark", True, 100000, "spark"),
])
def test_filtering_mode(tmp_path, filtering, ddl, version, mode):
    (tmp_path / "pubs.sql").write_text("")
    spec = load(tmp_path, BASE + f"filtering: {filtering}\n" + ("publications_ddl: pubs.sql\n" if ddl else ""))
    assert spec.filtering_mode(version) == mode


def test_filtering_source_on_a_publisher_before_15_is_refused(tmp_path):
    spec = load(tmp_path, BASE + "filtering: source\n")
    with pytest.raises(SpecError, match=r"filtering=source is not possible: the publisher is PostgreSQL 14"):
        spec.filtering_mode(140011)
