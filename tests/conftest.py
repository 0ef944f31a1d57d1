"""Test-wide setup: make tests/harness.py importable from every test folder; the S3 server fixture."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from object_store import serve  # noqa: E402  (importable only once the folder is on the path)


@pytest.fixture(scope="session")
def s3():
    """A real S3 endpoint on loopback (tests/object_store.py), one per session; each test takes its own bucket."""
    yield from serve()
