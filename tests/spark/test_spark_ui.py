"""A local job's Spark web UI against another OS user (uid 65534): the review of issue 42, item 2.

Found: with ``spark_master: local[…]`` the job's JVM listened on ``*:4040``; another user read
``/api/v1/applications``, ``/environment``, ``/sql?details=true`` and the thread dump, then ``POST /jobs/job/kill/
id=0`` killed the apply. Now a job's local session starts without a UI (nothing of the JVM answers HTTP), and a UI
asked for (``spark_conf: {spark.ui.enabled: true}``) listens on 127.0.0.1 only, without its kill links.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_rowfilter.spark import connect_server
from airflow_provider_rowfilter.spark.session import session_conf
from airflow_provider_rowfilter.spark.settings import ui_settings
from tests.attacker import REPO, as_root_only, run_as_nobody
from tests.ports import listening_ports

# A job's session, built as jobs build theirs (spark/session.py build_session) in a JVM of its own, running one job
# that sleeps; it says where it listens, waits for a line on stdin, then says whether the job is still running.
JOB = """
import json, sys, threading, time
from airflow_provider_rowfilter.spark.session import build_session

spark = build_session("rowfilter-apply-s1", "local[1]", json.loads(sys.argv[1]))
sc = spark.sparkContext
sc.setLogLevel("ERROR")
threading.Thread(target=lambda: sc.parallelize([1], 1).map(lambda x: time.sleep(120) or x).collect(),
                 daemon=True).start()
while not sc.statusTracker().getActiveJobsIds():
    time.sleep(0.2)
print(json.dumps({"jvm": sc._jvm.java.lang.ProcessHandle.current().pid(), "ui": sc.uiWebUrl,
                  "settings": {k: v for k, v in sc.getConf().getAll() if k.startswith("spark.ui.")}}), flush=True)
sys.stdin.readline()
print(json.dumps({"running": sc.statusTracker().getActiveJobsIds()}), flush=True)
sc.cancelAllJobs()
spark.stop()
"""

# uid 65534 asks each port for the application list, then to kill job 0, as the review did (the UI's first answer
# took 9 s on a loaded machine: Jersey starts on the first request).
ATTACK = """
import json, urllib.request, urllib.error
got = {{}}
for port in {ports!r}:
    for method, path, body in (("GET", "/api/v1/applications", None), ("POST", "/jobs/job/kill/", b"id=0")):
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{{port}}{{path}}", data=body,
                                                               method=method), timeout=60) as answer:
                got[f"{{port}} {{method}}"] = answer.status
        except urllib.error.HTTPError as e:
            got[f"{{port}} {{method}}"] = e.code
        except Exception as e:
            got[f"{{port}} {{method}}"] = type(e).__name__
print(json.dumps(got))
"""


def _attacked(conf: dict[str, str]) -> tuple[dict, dict[str, object], dict, dict[int, str]]:
    """The job's own report, what uid 65534 got from each port its JVM listens on, the report after, and the
    address each port is bound to."""
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(JOB), json.dumps(conf)], cwd=REPO, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as job:
        assert job.stdin is not None and job.stdout is not None
        try:
            before = json.loads(job.stdout.readline())
            ports = {port: _bound_address(before["jvm"], port) for port in listening_ports(before["jvm"])}
            done = run_as_nobody(ATTACK.format(ports=sorted(ports)), timeout=180)
            assert done.returncode == 0, done.stderr[-3000:]
            job.stdin.write("go\n")
            job.stdin.flush()
            after = json.loads(job.stdout.readline())
        finally:
            job.kill()
    return before, json.loads(done.stdout), after, ports


@pytest.mark.spark
@as_root_only
def test_a_local_job_opens_no_ui_and_no_port_of_its_jvm_answers_another_user():
    before, got, after, ports = _attacked({})
    assert before["ui"] is None and before["settings"]["spark.ui.enabled"] == "false"
    assert len(ports) >= 2 and set(ports.values()) == {"127.0.0.1"}  # the driver's RPC and the block manager
    assert not any(isinstance(answer, int) for answer in got.values()), got  # no HTTP answer at all
    assert after["running"] == [0]


@pytest.mark.spark
@as_root_only
def test_a_ui_asked_for_listens_on_loopback_only_and_refuses_to_kill():
    before, got, after, ports = _attacked({"spark.ui.enabled": "true"})
    ui_port = int(before["ui"].rsplit(":", 1)[1])
    assert before["settings"]["spark.ui.killEnabled"] == "false" and ui_port in ports
    assert ports[ui_port] == "127.0.0.1"  # not 0.0.0.0: no other host reaches it
    assert got[f"{ui_port} GET"] == 200  # a local user may read it (docs/operations.md, "Security") ...
    # ... but not kill anything: Spark's kill handler answers (a redirect to the jobs page) and does nothing when
    # spark.ui.killEnabled is false (JobsTab.handleKillRequest); the job is still running.
    assert got[f"{ui_port} POST"] == 200 and after["running"] == [0], (got, after)


@pytest.mark.parametrize("master, conf, launched, expected", [
    ("local[*]", {}, {}, {"spark.ui.enabled": "false"}),
    ("local[2]", {"spark.ui.enabled": "false"}, {}, {"spark.ui.enabled": "false"}),
    ("local", {"spark.ui.enabled": "true"}, {}, {"spark.ui.killEnabled": "false"}),
    ("local", {"spark.ui.enabled": "true", "spark.ui.killEnabled": "true"}, {}, {"spark.ui.killEnabled": "false"}),
    ("local[4]", {}, {"spark.ui.enabled": "true"}, {"spark.ui.killEnabled": "false"}),  # spark-submit's --conf
    ("local[4]", {"spark.ui.enabled": "false"}, {"spark.ui.enabled": "true"}, {"spark.ui.enabled": "false"}),
    ("yarn", {}, {}, {}), ("spark://master.example:7077", {}, {}, {}), ("local-cluster[2, 1, 1024]", {}, {}, {}),
])
def test_the_ui_settings_of_each_master(master, conf, launched, expected):
    assert ui_settings(master, conf, launched) == expected
    settings = session_conf(master, conf, launched=launched)
    for key, value in expected.items():
        assert settings[key] == value


def test_the_connect_server_s_ui_asked_for_cannot_kill():
    def settings(conf):
        command = connect_server.server_command(15002, conf=conf)
        return dict(command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--conf")

    assert settings(None)["spark.ui.enabled"] == "false"
    assert settings({"spark.ui.enabled": "true"})["spark.ui.killEnabled"] == "false"


def _bound_address(pid: int, port: int) -> str:
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                if len(address) == 8 or address.startswith("0000000000000000FFFF0000"):  # IPv4, or mapped in IPv6
                    return ".".join(str(int(address[-8:][i:i + 2], 16)) for i in (6, 4, 2, 0))
                return "::" if set(address) == {"0"} else address
    return "?"
