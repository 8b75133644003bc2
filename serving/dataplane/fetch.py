"""A replica's copy of its version's files, on whichever node it runs (no shared filesystem).

The Serve config names the weights as `artifact` and, unless the portal's files are readable in
place, a `source` (serving.registry.delivery): a signed portal URL or an S3 object, with the
version's checksum and size. The tar is streamed into a folder of the node's cache, unpacked
with tarfile's `data` filter (no links, devices or paths outside it), bounded by the declared
size, checksummed as it is written, and moved into place under its checksum only when that
matches; a replica finding it there (another replica of the node, a restart) uses it without a
byte sent. One fetch per
checksum and node at a time (a file lock); the others wait for it and read the result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import shutil
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

MAX_MEMBERS = 10_000
CHUNK = 1 << 20
READ_TIMEOUT_S = 60.0
# Tar headers and padding around the declared bytes of the files (a member costs <= 1.5 KiB).
SLACK_BYTES = 16 << 20


class FetchError(Exception):
    """The artifact could not be fetched, or what arrived is not what the portal signed."""


def cache_root() -> Path:
    configured = os.environ.get("PORTAL_ARTIFACT_CACHE_DIR", "").strip()
    root = Path(configured or Path(tempfile.gettempdir()) / f"portal-artifacts-{os.getuid()}")
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def local_artifact(config: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The directory to load `config`'s weights from, and how it got here (for the replica's
    reload history: `via`, `bytes`, `s`, `cached`)."""
    source = config.get("source")
    if not source:
        return Path(config["artifact"]), {"via": "path"}
    return fetch(dict(source))


def fetch(source: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    sha = str(source.get("sha256", ""))
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise FetchError("the artifact source has no valid sha256")
    root = cache_root()
    final = root / sha
    info: dict[str, Any] = {"via": source.get("via", ""), "sha256": sha, "cached": True}
    with _locked(root / f"{sha}.lock"):
        if (root / f"{sha}.ok").exists() and final.is_dir():
            os.utime(root / f"{sha}.ok")  # recently used: the last to be evicted
            return final, {**info, "bytes": 0, "s": 0.0}
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=root))
        try:
            with _open(source) as stream:
                received, have = _unpack(stream, work, limit=int(source.get("bytes") or 0))
            if have != sha:
                raise FetchError(
                    f"checksum mismatch: the portal signed {sha[:16]}…, got {have[:16]}…"
                )
            shutil.rmtree(final, ignore_errors=True)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        (root / f"{sha}.ok").touch()
        seconds = time.monotonic() - started
    return final, {**info, "cached": False, "bytes": received, "s": round(seconds, 3)}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_loopback_url(url: str) -> bool:
    """Whether the URL names this machine (never sent through an HTTP proxy)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _open(source: dict[str, Any]) -> Iterator[BinaryIO]:
    via = source.get("via")
    if via == "portal":
        url = str(source.get("url", ""))
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise FetchError("the artifact URL is not http(s)")
        # A loopback portal is never reached through the environment's HTTP proxy.
        handlers = [urllib.request.ProxyHandler({})] if is_loopback_url(url) else []
        opener = urllib.request.build_opener(*handlers)
        try:
            response = opener.open(url, timeout=READ_TIMEOUT_S)
        except OSError as exc:  # urllib's HTTPError and URLError are OSErrors
            raise FetchError(f"fetching the artifact from the portal failed: {exc}") from None
        with response:
            yield response
    elif via == "s3":
        import boto3  # the node's credentials, from its environment

        client = boto3.client(
            "s3",
            endpoint_url=source.get("endpoint_url") or None,
            region_name=source.get("region") or None,
        )
        try:
            body = client.get_object(Bucket=source["bucket"], Key=source["key"])["Body"]
        except Exception as exc:  # botocore's errors: no credentials, no object, no endpoint
            where = f"s3://{source.get('bucket')}/{source.get('key')}"
            raise FetchError(f"fetching {where} failed: {exc}") from None
        with contextlib.closing(body):
            yield body
    else:
        raise FetchError(f"unknown artifact source {via!r}")


class _Bounded:
    """A stream that refuses to yield more than `limit` bytes (a tar bomb, a wrong object)."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self.stream, self.limit, self.read_bytes = stream, limit, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.stream.read(size if size is not None and size >= 0 else 1 << 20)
        self.read_bytes += len(chunk)
        if self.read_bytes > self.limit:
            raise FetchError(f"the artifact is larger than the {self.limit} bytes declared")
        return chunk


def _unpack(stream: BinaryIO, dest: Path, *, limit: int) -> tuple[int, str]:
    """Unpack the tar as it streams in; (bytes read, the checksum of what was written). The
    checksum is serving.engine.checkpoint.directory_sha256's, taken while writing (reading the
    folder again afterwards cost a fifth of a fetch)."""
    bounded = _Bounded(stream, (limit or 0) + SLACK_BYTES)
    digests: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=bounded, mode="r|", bufsize=CHUNK) as archive:  # type: ignore[call-overload]
            for count, member in enumerate(archive, start=1):
                if count > MAX_MEMBERS:
                    raise FetchError(f"the artifact has more than {MAX_MEMBERS} entries")
                if not (member.isreg() or member.isdir()):
                    raise FetchError(f"{member.name!r} is not a regular file")
                safe = tarfile.data_filter(member, str(dest))  # raises on an unsafe path
                target = dest / safe.name
                if safe.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                digests[PurePosixPath(safe.name).as_posix()] = _write(archive, safe, target)
    except tarfile.FilterError as exc:  # a path outside the folder, an absolute path
        raise FetchError(f"the artifact has an unsafe entry ({exc})") from None
    except (tarfile.TarError, EOFError) as exc:
        raise FetchError(f"the artifact is not a readable tar ({exc})") from None
    total = hashlib.sha256()
    for name in sorted(digests):
        total.update(name.encode() + b"\0" + digests[name])
    return bounded.read_bytes, total.hexdigest()


def _write(archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> bytes:
    source = archive.extractfile(member)
    if source is None:
        raise FetchError(f"{member.name!r} has no content")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with source, target.open("wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.digest()
