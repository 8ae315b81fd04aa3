"""The files a user hands us, against content that once broke or hung ``rowfilter validate`` (issue 42, item 4)."""

from __future__ import annotations

import os
import threading

import pytest
import yaml

from airflow_provider_rowfilter.core.errors import SpecError
from airflow_provider_rowfilter.core.spec.input_files import MAX_SPEC_BYTES, MAX_YAML_DEPTH, read_text, yaml_document
from airflow_provider_rowfilter.core.spec.subscription import SubscriptionSpec

VALID = "subscription: s1\npublications: [p1]\npublisher: postgresql://u@127.0.0.1:1/db\n"


def _load(tmp_path, data: bytes) -> str:
    path = tmp_path / "s1.yaml"
    path.write_bytes(data)
    with pytest.raises(SpecError) as refused:
        SubscriptionSpec.load(path)
    return str(refused.value)


@pytest.mark.parametrize("data, expected", [
    (b"subscription: bad\xe9\npublications: [p1]\n",
     ['invalid byte sequence for encoding "UTF8": 0xe9 at byte 17 (line 1)', "s1.yaml", "iconv -f LATIN1"]),
    (VALID.encode("utf-16"), ["0xff at byte 0 (line 1)", "it is UTF-16", "iconv -f UTF-16"]),
    (VALID.encode().replace(b"s1", b"s\xb1", 1), ["0xb1 at byte 15 (line 1)"]),  # one flipped bit
    (b"subscription: s1\npublications: " + b"[" * 3000 + b"]" * 3000 + b"\n",
     [f"nests more than {MAX_YAML_DEPTH} mappings or lists", "line 2, column"]),
    (b"subscription: s1\nx:\n" + b"".join(b" " * i + b"- \n" for i in range(1, 500)), ["nests more than"]),
    (b"a: 1\n" * (MAX_SPEC_BYTES // 5 + 1), ["larger than 1 MiB"]),
    (b'subscription: "a\\0b"\npublications: [p1]\n', ["subscription name 'a\\x00b' is not a valid PostgreSQL name"]),
    (b'subscription: s1\npublications: [p1]\npublications_ddl: "p\\0.sql"\n', ["publications_ddl 'p\\x00.sql' holds a NUL"]),
    (b'subscription: s1\npublications: [p1]\nchange_log: "c\\0"\n', ["c\\x00' holds a NUL character", "change_log"]),
    (b"subscription: s1\npublications: [p1]\napply_schedule: 1" + b"0" * 300 + b"\n", ["apply_schedule", "from 0 to"]),
    (b"subscription: s1\npublications: [p1]\napply_schedule: '1" + b"0" * 400 + b"d'\n", ["longer than 2147483647"]),
])
def test_a_spec_file_that_broke_validate_is_refused_with_the_file_and_the_fix(tmp_path, data, expected):
    text = _load(tmp_path, data)
    for fragment in expected:
        assert fragment in text, text


def test_a_fifo_a_directory_and_a_device_are_refused_unread(tmp_path):
    fifo = tmp_path / "pubs.sql"
    os.mkfifo(fifo)
    (tmp_path / "dir.sql").mkdir()
    outcome: list[str] = []
    # No writer ever opens the FIFO: reading it would block for good.
    reader = threading.Thread(target=lambda: outcome.extend(_refusal(p) for p in (fifo, tmp_path / "dir.sql",
                                                                                 "/dev/zero")), daemon=True)
    reader.start()
    reader.join(20)
    assert outcome == ["is a FIFO, not a regular file", "is a directory, not a regular file",
                       "is a character device, not a regular file"]


def test_a_publications_file_that_is_a_fifo_is_refused_by_the_spec(tmp_path):
    os.mkfifo(tmp_path / "pubs.sql")
    (tmp_path / "s1.yaml").write_text(VALID + "publications_ddl: pubs.sql\n")
    spec = SubscriptionSpec.load(tmp_path / "s1.yaml")
    with pytest.raises(SpecError, match="publications_ddl file .*pubs.sql.* of subscription 's1' is a FIFO"):
        spec.publications_sql()


def test_yaml_as_deep_as_the_limit_reads():
    text = "a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1)  # in the top mapping
    assert yaml_document(text, "x") == yaml.safe_load(text)
    with pytest.raises(SpecError, match="nests more than"):
        yaml_document("a: " + "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH, "x")


def _refusal(path) -> str:
    try:
        read_text(path, "f", 100)
    except SpecError as e:
        return e.message.removeprefix("f ")
    return "read"
