"""An S3-compatible server on 127.0.0.1 for the change log's object-storage tests: moto's server, in a process of
its own (a real HTTP endpoint, what pyarrow's S3 client and every job process the tests start talk to).

Its credentials reach the code under test as they do in production: through the standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), never a command line.
The server requires signed requests from the first one on (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``: IAM
enforced after the three calls that make the tests' user, its policy and its key), so a wrong or revoked key is refused
as S3 refuses it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.reaper import reaped

REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen

    def environment(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard variables a job reads (pyarrow's S3 client, boto)."""
        return {"AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=REGION)

    def bucket(self) -> str:
        name = f"rowfilter-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's server on a free port of 127.0.0.1 with IAM enforced; stop it at the end."""
    import boto3

    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3", "MOTO_CALL_RESET_API": "false"}
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "moto's server exited"
                assert time.monotonic() < deadline, "moto's server did not start"
                time.sleep(0.1)
        iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap", region_name=REGION)
        iam.create_user(UserName="rowfilter-tests")
        key = iam.create_access_key(UserName="rowfilter-tests")["AccessKey"]
        iam.put_user_policy(UserName="rowfilter-tests", PolicyName="all", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'))
        with reaped(process.pid):
            yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], process)
    finally:
        process.terminate()
        process.wait(timeout=30)

