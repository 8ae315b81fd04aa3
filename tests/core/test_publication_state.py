"""core/publication/state.py: what a drift check names, from two readings of the publisher's catalog."""

from __future__ import annotations

import copy

from airflow_provider_rowfilter.core.publication.state import changes

RECORDED = {
    "present": ["public.t", "public.u"],
    "publications": {"p": {"all_tables": False, "publish": ["insert", "update", "delete", "truncate"],
                           "publish_via_partition_root": False, "publish_generated_columns": "n"}},
    "members": {"p": {"public.t": ["(v > 10)", None], "public.u": [None, ["id", "a"]]}},
    "schemas": {"p": ["s1"]},
    "partitions": {},
    "generated": {"public.t": ["g"]},
}


def changed(edit) -> list[str]:
    current = copy.deepcopy(RECORDED)
    edit(current)
    return changes(RECORDED, current)


def test_the_same_reading_changes_nothing():
    assert changes(RECORDED, copy.deepcopy(RECORDED)) == []


def test_each_difference_is_named():
    assert changed(lambda s: s["publications"]["p"].update(publish_via_partition_root=True)) == [
        "publication p: publish_via_partition_root changed from false to true"]
    assert changed(lambda s: s["publications"].pop("p")) == ["publication p no longer exists"]
    assert changed(lambda s: s["schemas"]["p"].append("s2")) == ["publication p: schema s2 added (TABLES IN SCHEMA)"]
    assert changed(lambda s: s["generated"]["public.t"].append("h")) == [
        "table public.t: generated columns changed from (g) to (g, h)"]
    assert changed(lambda s: s["members"]["p"].__setitem__("public.u", [None, None])) == [
        "table public.u in publication p: column list changed from (id, a) to none"]


def test_a_table_gone_under_its_name_is_left_to_the_relation_check():
    """Dropped, it sends nothing more; renamed, its next change stops the batch (apply_plan.check_relations)."""
    def rename(s):
        s["present"].remove("public.t")
        del s["members"]["p"]["public.t"]
        del s["generated"]["public.t"]
    assert changed(rename) == []


def test_a_followed_column_rename_reads_as_the_publisher_shows_it():
    """schema_changes: follow renamed u.n to n2: PostgreSQL's stored filter and column list follow it (by number), so
    the recording is compared as renamed; a function of that name, a string and another column are left alone."""
    from airflow_provider_rowfilter.core.publication.state import renamed_state

    recorded = {"present": ["public.u"], "publications": {"p": {}},
                "members": {"p": {"public.u": ["((n > 50) AND (abs(n) = 'n'::text::int) AND (nn > 1))", ["k", "n"]],
                                  "public.t": ["(n > 1)", None]}}}
    got = renamed_state(recorded, [("public.u", "n", "n2"), ("public.u", "k", "Key K")])
    assert got["members"]["p"]["public.u"] == ["((n2 > 50) AND (abs(n2) = 'n'::text::int) AND (nn > 1))",
                                               ["Key K", "n2"]]
    assert got["members"]["p"]["public.t"] == ["(n > 1)", None]  # another table's n
    assert recorded["members"]["p"]["public.u"][0].startswith("((n > 50)")  # the recording itself is kept
    assert changes(got, {**recorded, "members": {"p": {"public.u": [
        "((n2 > 50) AND (abs(n2) = 'n'::text::int) AND (nn > 1))", ["Key K", "n2"]], "public.t": ["(n > 1)", None]}}}) == []
