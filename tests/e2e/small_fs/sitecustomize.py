"""Imported at start by every Python process of a test run on a machine that cannot mount a tmpfs
(tests/e2e/test_local_failures.py puts this folder on PYTHONPATH): the folder BRAIN_TEST_SMALL_FS
(`FOLDER:BYTES`) reports the free space of a filesystem of BYTES, as `shutil.disk_usage` (what the
runner and the trainer ask before they write a checkpoint) sees it."""

import os
import shutil
from pathlib import Path

_SPEC = os.environ.get("BRAIN_TEST_SMALL_FS")
if _SPEC:
    _ROOT, _SIZE = _SPEC.rsplit(":", 1)
    _real = shutil.disk_usage

    def _disk_usage(path):
        usage = _real(path)
        if not os.path.abspath(path).startswith(_ROOT):
            return usage
        used = sum(f.stat().st_size for f in Path(_ROOT).rglob("*") if f.is_file())
        return usage._replace(total=int(_SIZE), used=used, free=max(0, int(_SIZE) - used))

    shutil.disk_usage = _disk_usage
