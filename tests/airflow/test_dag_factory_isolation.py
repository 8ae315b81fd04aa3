"""One bad spec file never takes down the other subscriptions nor the Replication page (issue 42, item 3).

Found: a spec file that is not UTF-8 (Latin-1, UTF-16, one flipped byte) or YAML nested 3,000 deep made the
factory's DAG file fail to import (DagBag loaded 0 DAGs instead of 9: UnicodeDecodeError, RecursionError), and
``GET /rowfilter/api/subscriptions`` answered 500 to everyone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_rowfilter.dag_factory import DAG_KINDS, dags_from_folder
from tests.airflow.support import REPO

VALID = b"""\
subscription: team_a
publisher_conn_id: rowfilter_publisher
subscriber_conn_id: rowfilter_subscriber
publications: [p1]
"""
#: file name -> (its bytes, what its placeholder's description says)
BAD = {
    "latin1.yaml": (b"subscription: bad\xe9\npublisher_conn_id: pub\nsubscriber_conn_id: sub\npublications: [p1]\n",
                    'invalid byte sequence for encoding "UTF8": 0xe9 at byte 17 (line 1)'),
    "utf16.yaml": (VALID.replace(b"team_a", b"team_u").decode().encode("utf-16"), "0xff at byte 0"),
    "flipped.yaml": (VALID.replace(b"team_a", b"team_f").replace(b"rowfilter_publisher", b"rowfilter_pub\xccisher"),
                     "0xcc at byte"),
    "deep.yaml": (VALID.replace(b"team_a", b"team_d") + b"x: " + b"[" * 3000 + b"]" * 3000 + b"\n",
                  "nests more than 64 mappings or lists"),
    "deep_block.yaml": (VALID.replace(b"team_a", b"team_e") + b"x:\n" + b"".join(b" " * i + b"- \n"
                                                                                 for i in range(1, 1200)),
                        "nests more than 64 mappings or lists"),
}


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "team_a.yaml").write_bytes(VALID)
    for name, (data, _) in BAD.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def test_each_bad_file_becomes_its_placeholder_and_the_valid_one_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      airflow_db: dict[str, str]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("ROWFILTER_SUBSCRIPTIONS_DIR", str(_folder(tmp_path)))
    loader = REPO / "dags" / "rowfilter_subscriptions.py"
    bag = DagBag(dag_folder=loader)
    assert bag.import_errors == {}
    valid = {f"rowfilter_team_a_{kind}" for kind in DAG_KINDS}
    assert valid <= set(bag.dags) and len(valid) == 12
    placeholders = {dag_id: dag for dag_id, dag in bag.dags.items() if dag_id not in valid}
    for name, (_, said) in BAD.items():
        mine = [dag for dag in placeholders.values() if name in dag.description]
        assert mine, (name, sorted(placeholders))
        for dag in mine:
            assert [t.task_id for t in dag.tasks] == ["invalid_spec"] and said in dag.description, dag.description
            assert "Traceback" not in dag.description
    # the Latin-1 file's subscription cannot be read as a name: it stands under the file's name, on the schedule
    assert "rowfilter_invalid_latin1.yaml" in placeholders
    # a file whose names still read keeps its DAG ids (a run in flight finds its DAG)
    assert "rowfilter_team_d_incremental_sync" in placeholders


def test_a_file_the_factory_cannot_even_read_leniently_still_gets_a_placeholder(tmp_path: Path) -> None:
    (tmp_path / "team_a.yaml").write_bytes(VALID)
    (tmp_path / "huge.yaml").write_bytes(b"a: 1\n" * 300_000)  # past the 1 MiB limit: not even read leniently
    dags = dags_from_folder(tmp_path)
    assert "rowfilter_invalid_huge.yaml" in dags and "larger than 1 MiB" in dags["rowfilter_invalid_huge.yaml"].description
    assert {f"rowfilter_team_a_{kind}" for kind in DAG_KINDS} <= set(dags)


PAGE = r"""
import json
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

client = TestClient(create_app())
token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
answer = client.get("/rowfilter/api/subscriptions", headers={"Authorization": f"Bearer {token}"})
print("RESULT " + json.dumps({"status": answer.status_code, "body": answer.json() if answer.status_code == 200 else answer.text}))
"""


def test_the_page_lists_each_bad_file_as_invalid_beside_the_valid_one(tmp_path: Path,
                                                                      airflow_db: dict[str, str]) -> None:
    env = {**airflow_db, "ROWFILTER_SUBSCRIPTIONS_DIR": str(_folder(tmp_path)),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin"}
    done = subprocess.run([sys.executable, "-c", PAGE], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(line.removeprefix("RESULT "))
    assert out["status"] == 200, out
    views = {Path(v["spec_file"]).name: v for v in out["body"]}
    assert set(views) == {"team_a.yaml", *BAD}, sorted(views)
    valid = views["team_a.yaml"]
    assert valid["subscription"] == "team_a" and not (valid["error"] or "").startswith("invalid spec file"), valid
    for name, (_, said) in BAD.items():
        assert views[name]["health"]["verdict"] == "broken", views[name]
        assert views[name]["error"].startswith("invalid spec file: ") and said in views[name]["error"], views[name]
