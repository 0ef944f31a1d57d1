"""Checkpoints under a prefix of an object-storage bucket (checkpoint.dir: s3://bucket/prefix): store.py's
functions, with the same names and meaning, for a bucket (location.py picks one of the two).

    s3://bucket/prefix/
      step-00000040/          committed: shards + .metadata + manifest.json, the manifest written last
      step-00000060/          no manifest: being written, or left by a crash; never loaded, removed at start
      step-00000050.corrupt/  refused or damaged at load: copied here, then deleted from its step
      set-aside-20250101T120000Z-resume-from-none/step-.../
                              checkpoints checkpoint.resume_from moved out of the way
      lease-00000007.json     the lease (bucket_lease.py)

A bucket has no rename, so the manifest is the commit: every rank writes its shards under the step's
prefix, DCP writes .metadata once all of them are written, and then one rank, its lease checked, writes
manifest.json. A step without one is never loaded, and the holder of the lease deletes it (and aborts its
unfinished multipart uploads) at start. Deleting goes the other way: the manifest first, so that a step half
deleted is an uncommitted one, never a torn committed one. Moving (set aside, quarantine) is a server-side
copy of every object, the manifest last, then that delete.

The endpoint and credentials are the environment's (s3.py). Torch-free.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, Callable, Iterable, Iterator, Optional

from ..contract import CHECKPOINT_PREFIX, format_time, step_dir_name, step_of
from ..contract import MANIFEST_FILE as MANIFEST
from ..s3 import client
from .store import (
    CORRUPT_SUFFIX,
    MANIFEST_FORMAT,
    SET_ASIDE_PREFIX,
    SUM_SUFFIX,
    Candidate,
    Checksum,
    ManifestError,
    parse_manifest,
)

log = logging.getLogger(__name__)

SCHEME = "s3://"
_CHUNK = 8 << 20
_MAX_MANIFEST = 64 << 20  # a manifest lists files, a few hundred bytes each: anything this large is not one
_DELETE_BATCH = 1000  # S3's most keys in one DeleteObjects call


class BucketPath(PurePosixPath):
    """s3://bucket/key as a path: name, parent, / and with_name as for a folder. Never a local path: os.fspath
    refuses it, so no file operation meant for a volume can quietly create a folder named "s3:"."""

    @classmethod
    def of(cls, uri: str) -> "BucketPath":
        return cls(uri.partition("://")[2].strip("/"))

    def __str__(self) -> str:
        return SCHEME + super().__str__()

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is a prefix of an object-storage bucket, not a local path")

    @property
    def bucket(self) -> str:
        return self.parts[0]

    @property
    def key(self) -> str:
        return "/".join(self.parts[1:])

    @property
    def prefix(self) -> str:
        """The key prefix of what lies below this path, as of a folder."""
        return self.key + "/" if self.key else ""




def error_code(exc: BaseException) -> Optional[str]:
    """The S3 error code of a boto ClientError ('NoSuchKey', 'PreconditionFailed', ...), else None."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None


# -- objects --


def read_bytes(path: BucketPath, limit: Optional[int] = None) -> bytes:
    """The object's bytes; FileNotFoundError when there is none, ValueError when it is over `limit` bytes."""
    try:
        reply = client().get_object(Bucket=path.bucket, Key=path.key)
    except Exception as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            raise FileNotFoundError(str(path)) from None
        raise
    body = reply["Body"]
    try:
        if limit is not None and reply["ContentLength"] > limit:
            raise ValueError(f"{reply['ContentLength']} bytes, more than {limit}")
        return body.read()
    finally:
        body.close()


def read_text(path: BucketPath) -> str:
    return read_bytes(path).decode("utf-8")


def write_text(path: BucketPath, text: str) -> None:
    """One PUT: readers see the old object or the new one, never a part."""
    client().put_object(Bucket=path.bucket, Key=path.key, Body=text.encode("utf-8"))


def open_read(path: BucketPath) -> io.BytesIO:
    """A small object (DCP's .metadata) as a binary file."""
    return io.BytesIO(read_bytes(path))


def is_file(path: BucketPath) -> bool:
    """Whether an object has this key."""
    try:
        client().head_object(Bucket=path.bucket, Key=path.key)
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def objects(folder: BucketPath, begins: str = "") -> dict[str, int]:
    """{name below folder: size} of every object under the folder's prefix (whose name `begins` so)."""
    pages = client().get_paginator("list_objects_v2").paginate(Bucket=folder.bucket, Prefix=folder.prefix + begins)
    return {item["Key"][len(folder.prefix):]: item["Size"] for page in pages for item in page.get("Contents", ())}


def children(folder: BucketPath) -> list[str]:
    """The names of the 'folders' directly below folder (common prefixes), sorted."""
    pages = client().get_paginator("list_objects_v2").paginate(Bucket=folder.bucket, Prefix=folder.prefix,
                                                               Delimiter="/")
    return sorted(item["Prefix"][len(folder.prefix):].rstrip("/") for page in pages
                  for item in page.get("CommonPrefixes", ()))


def delete_keys(bucket: str, keys: list[str]) -> None:
    for start in range(0, len(keys), _DELETE_BATCH):
        batch = [{"Key": key} for key in keys[start : start + _DELETE_BATCH]]
        reply = client().delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        if reply.get("Errors"):
            first = reply["Errors"][0]
            raise OSError(f"s3://{bucket}/{first.get('Key')}: not deleted ({first.get('Code')}: {first.get('Message')})")


def delete_folder(folder: BucketPath) -> None:
    """Delete every object under folder, its manifest first: what a crash leaves is uncommitted, never torn."""
    names = objects(folder)
    if MANIFEST in names:
        delete_keys(folder.bucket, [(folder / MANIFEST).key])
    delete_keys(folder.bucket, [(folder / name).key for name in names if name != MANIFEST])


def _move(source: BucketPath, target: BucketPath) -> None:
    """Server-side copy of every object of source to target (the manifest last), then delete source."""
    names = sorted(objects(source), key=lambda name: name == MANIFEST)
    for name in names:
        client().copy({"Bucket": source.bucket, "Key": (source / name).key}, target.bucket, (target / name).key)
    delete_folder(source)


# -- checksums --


def object_digest(path: BucketPath) -> dict[str, Any]:
    """Size and CRC-32 of an object, streamed through (nothing of it kept)."""
    checksum = Checksum()
    body = client().get_object(Bucket=path.bucket, Key=path.key)["Body"]
    try:
        for chunk in body.iter_chunks(_CHUNK):
            checksum.update(memoryview(chunk))
    finally:
        body.close()
    return checksum.digest()


def write_shard_sums(folder: BucketPath, digests: dict[str, dict[str, Any]]) -> None:
    """Record size and checksum of shards this rank wrote, next to them (read back at commit)."""
    for name, digest in digests.items():
        write_text(folder / (name + SUM_SUFFIX), json.dumps(digest))


def verify_files(folder: BucketPath, files: dict[str, Any], names: Iterable[str]) -> list[str]:
    """Problems with the named objects against their manifest entries; [] when all match."""
    problems = []
    sizes = objects(folder)
    for name in names:
        want = files[name]
        size = sizes.get(name)
        if size is None:
            problems.append(f"{name}: missing")
            continue
        if size != want["size"]:
            kind = "truncated" if size < want["size"] else "grown"
            problems.append(f"{name}: {size} bytes, manifest says {want['size']} ({kind})")
            continue
        got = object_digest(folder / name)
        if got["crc32"] != want["crc32"]:
            problems.append(f"{name}: checksum {got['crc32']}, manifest says {want['crc32']} (corrupted)")
    return problems


# -- checkpoints: store.py's functions --


def tmp_dir(root: BucketPath, step: int) -> BucketPath:
    """Where the checkpoint of `step` is written: its own name (no rename to come; the manifest commits it)."""
    return root / step_dir_name(step)


def commit(folder: BucketPath, final: BucketPath, fields: dict[str, Any],
           before_rename: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Write the manifest of a fully written step, last: that is its commit.

    As store.commit: every object is listed with its size and checksum (shards from their ranks' sidecars,
    DCP's .metadata digested here), and `before_rename` may still refuse the commit by raising (the lease's
    fencing check) before the manifest is written.
    """
    if folder != final:
        raise ValueError(f"{folder}: a bucket's checkpoint is written under its final name {final}")
    names = objects(folder)
    sidecars = [name for name in names if name.endswith(SUM_SUFFIX)]
    files: dict[str, Any] = {}
    for name in sorted(names):
        if name.endswith(SUM_SUFFIX) or name == MANIFEST:
            continue
        sidecar = name + SUM_SUFFIX
        files[name] = json.loads(read_text(folder / sidecar)) if sidecar in names else object_digest(folder / name)
    delete_keys(folder.bucket, [(folder / name).key for name in sidecars])
    manifest = {"format": MANIFEST_FORMAT, **fields, "time": format_time(), "files": files}
    before_rename()
    write_text(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(folder: BucketPath) -> dict[str, Any]:
    try:
        raw = read_bytes(folder / MANIFEST, limit=_MAX_MANIFEST)
    except FileNotFoundError:
        raise ManifestError(f"{folder}: no {MANIFEST} (not committed)") from None
    except ValueError as exc:
        raise ManifestError(f"{folder}: unreadable {MANIFEST}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{folder}: unreadable {MANIFEST}: {exc}") from None
    return parse_manifest(folder, text)


def list_checkpoints(root: BucketPath) -> list[Candidate]:
    """Prefixes named step-XXXXXXXX in root, newest first, with their parsed manifests."""
    found = []
    for name in children(root):
        step = step_of(name)
        if step is None:
            continue
        try:
            found.append(Candidate(step, root / name, read_manifest(root / name)))
        except ManifestError as exc:
            found.append(Candidate(step, root / name, None, str(exc)))
    return sorted(found, key=lambda c: c.step, reverse=True)


def latest_checkpoint(root: BucketPath) -> Optional[BucketPath]:
    """The newest committed checkpoint in root (manifest present; shards not verified)."""
    return next((c.path for c in list_checkpoints(root) if c.manifest is not None), None)


def _uploads(root: BucketPath) -> Iterator[tuple[str, str, str]]:
    """(step folder name, key, upload id) of every unfinished multipart upload below root's step folders."""
    pages = client().get_paginator("list_multipart_uploads").paginate(Bucket=root.bucket,
                                                                      Prefix=root.prefix + CHECKPOINT_PREFIX)
    for page in pages:
        for upload in page.get("Uploads", ()):
            name = upload["Key"][len(root.prefix):].split("/", 1)[0]
            yield name, upload["Key"], upload["UploadId"]


def remove_stale(root: BucketPath) -> None:
    """Delete steps without a manifest and abort their unfinished uploads (only while no save is in flight)."""
    uploads = list(_uploads(root))
    names = {name for name in children(root) if step_of(name) is not None} | {name for name, _, _ in uploads}
    stale = {name for name in names if step_of(name) is not None and not is_file(root / name / MANIFEST)}
    for name, key, upload_id in uploads:
        if name in stale:
            client().abort_multipart_upload(Bucket=root.bucket, Key=key, UploadId=upload_id)
    for name in sorted(stale):
        log.warning("removing uncommitted checkpoint %s (its save was interrupted)", root / name)
        delete_folder(root / name)


def quarantine(path: BucketPath) -> BucketPath:
    """Move a refused or damaged checkpoint to <step>.corrupt/ (copied, then deleted), kept for inspection."""
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    delete_folder(target)
    _move(path, target)
    return target


def apply_retention(root: BucketPath, keep_last: int) -> list[BucketPath]:
    """Delete all but the newest keep_last committed checkpoints, oldest first, each its manifest first."""
    committed = [c.path for c in list_checkpoints(root) if c.manifest is not None]
    doomed = committed[keep_last:]
    for path in reversed(doomed):
        delete_folder(path)
    return doomed


def lineage(root: BucketPath) -> list[tuple[int, BucketPath]]:
    """(step, prefix) of every checkpoint a run left, committed or not, and quarantined ones; oldest first."""
    found = []
    for name in children(root):
        step = step_of(name.removesuffix(CORRUPT_SUFFIX))
        if step is not None:
            found.append((step, root / name))
    return sorted(found)


def set_aside(root: BucketPath, folders: list[BucketPath], reason: str) -> BucketPath:
    """Move prefixes of root below a new root/set-aside-<UTC time>-<reason>/ and return it (store.set_aside)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    taken = set(children(root))
    name = f"{SET_ASIDE_PREFIX}{stamp}-{reason}"
    for n in range(1, 1000):
        if name not in taken:
            break
        name = f"{SET_ASIDE_PREFIX}{stamp}-{reason}-{n}"
    target = root / name
    for folder in folders:
        _move(folder, target / folder.name)
    return target


def set_aside_folders(root: BucketPath) -> list[BucketPath]:
    """The set-aside prefixes in root, oldest first (their names start with the UTC time)."""
    return [root / name for name in children(root) if name.startswith(SET_ASIDE_PREFIX)]


# -- the storage check before start --


def explain(exc: BaseException, root: BucketPath) -> str:
    """What went wrong reaching root, in words: no bucket, access denied, unreachable endpoint, no credentials."""
    code, kind = error_code(exc), type(exc).__name__
    if code in ("NoSuchBucket",):
        return f"bucket {root.bucket} does not exist"
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
        return f"access denied ({code}): the credentials may not write, read and delete under {root}"
    if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError"):
        return f"endpoint {client().meta.endpoint_url} unreachable ({exc})"
    if kind in ("NoCredentialsError", "PartialCredentialsError"):
        return f"no credentials ({exc}): set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a service account"
    return f"{kind}: {exc}"


def probe(root: BucketPath) -> Optional[str]:
    """Write, read back and delete a small object under root; None when all three work, else the reason."""
    path = root / f".probe-{uuid.uuid4().hex}"
    try:
        write_text(path, "probe")
        if read_text(path) != "probe":
            return f"checkpoint.dir {root}: an object read back differs from what was written"
        delete_keys(path.bucket, [path.key])
    except Exception as exc:  # every failure is named, none is retried here (boto already retried)
        return f"checkpoint.dir {root}: {explain(exc, root)}"
    return None
