"""A real S3 endpoint for the tests: moto's S3 server as a child process on loopback, over HTTP.

    def test_x(s3):                       # the fixture (tests/conftest.py): one server per test session
        bucket = s3.bucket()              # a fresh, empty bucket of its own: "s3://<name>"
        env = s3.env                      # what a trainer needs to reach it: endpoint and dummy credentials

moto implements S3's conditional writes (`If-None-Match: *`, `If-Match: <etag>`) the way AWS documents them
(moto/s3/responses.py, `put_object` and `complete_multipart_upload`), which the checkpoint lease relies on.
The server keeps everything in memory and is killed with its process tree when the session ends.
"""

from __future__ import annotations

import re
import sys
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from processes import Child, start

READY = re.compile(r"Running on (http://127\.0\.0\.1:\d+)")
# moto accepts any key pair; these keep boto from looking for real credentials or instance metadata.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class S3Server:
    endpoint: str
    child: Child = field(repr=False)

    @property
    def env(self) -> dict[str, str]:
        """The variables a process needs to use this server (boto and s3fs read AWS_ENDPOINT_URL)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())

    def bucket(self) -> str:
        """A new empty bucket: its s3:// URL."""
        name = f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"


def _boto_credentials() -> dict[str, str]:
    return {"aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": CREDENTIALS["AWS_DEFAULT_REGION"]}


def serve() -> Iterator[S3Server]:
    """Start the server (port 0: the kernel picks a free one, which the server prints) and stop it after."""
    with start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"], timeout=3600) as child:
        for line in child.lines():
            ready = READY.search(line)
            if ready:
                yield S3Server(ready.group(1), child)
                return
        raise RuntimeError(f"moto's S3 server did not start:\n{child.output}")
