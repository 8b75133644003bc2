"""How replicas on any Ray node get a version's files (ARTIFACT_DELIVERY).

* `path`: the replica reads the directory where the portal has it (one host, or a filesystem
  every node mounts); the Serve config carries the path.
* `portal`: the replica fetches a tar of the directory from the portal
  (`GET /artifacts/v1/<version>/<sha256>.tar?exp=&sig=`), a URL signed with the portal's secret
  that expires. The URL stays the same for ARTIFACT_URL_TTL_S (so reconciles do not churn
  replicas) and is valid at least that long afterwards; a periodic reconcile renews it.
* `s3`: the portal uploads the same tar once per checksum to S3-compatible storage (boto3,
  credentials from its environment) and replicas read it with their node's credentials.

Either way the Serve config carries a `source` (never a secret of the storage), and the node
verifies the checksum of what it unpacked before loading it (serving.dataplane.fetch), caching
it per node by checksum. The tar is streamed from the files as they are, never held whole.
"""

from __future__ import annotations

import hmac
import logging
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac

from serving.registry import artifacts
from serving.registry.models import ModelVersion, VersionStatus

logger = logging.getLogger(__name__)

SIGN_SALT = "serving.registry.delivery.artifact-url"
BLOCK = tarfile.BLOCKSIZE
CHUNK = 1 << 20
_published: set[str] = set()  # checksums this process saw in S3 (uploads are idempotent)


@dataclass(frozen=True)
class TarEntry:
    path: Path
    header: bytes
    size: int

    @property
    def padding(self) -> int:
        return -self.size % BLOCK


def tar_entries(directory: Path) -> list[TarEntry]:
    """Every regular file under `directory` as an ustar/pax member, by relative path, with
    owner and times zeroed (the same files give the same archive)."""
    entries = []
    for path in sorted(p for p in directory.rglob("*") if not p.is_dir()):
        if path.is_symlink():
            raise artifacts.ArtifactRejected(f"{path.relative_to(directory)} is a symlink")
        info = tarfile.TarInfo(path.relative_to(directory).as_posix())
        info.size = path.stat().st_size
        info.mode, info.mtime = 0o644, 0
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        entries.append(TarEntry(path, header, info.size))
    return entries


def tar_size(entries: Iterable[TarEntry]) -> int:
    return sum(len(e.header) + e.size + e.padding for e in entries) + 2 * BLOCK


def stream_tar(entries: list[TarEntry]) -> Iterator[bytes]:
    """The archive of `entries`, a chunk at a time (headers, contents, padding, end marker)."""
    for entry in entries:
        yield entry.header
        left = entry.size
        with entry.path.open("rb") as handle:
            while left > 0:
                chunk = handle.read(min(CHUNK, left))
                if not chunk:
                    raise OSError(f"{entry.path.name} shrank while it was being sent")
                left -= len(chunk)
                yield chunk
        if entry.padding:
            yield b"\0" * entry.padding
    yield b"\0" * (2 * BLOCK)


# --- signed URLs (ARTIFACT_DELIVERY=portal) -------------------------------------------------


def url_expiry(now: float | None = None) -> int:
    """The expiry every URL signed in this TTL window shares: at least one TTL away."""
    ttl = max(60, int(settings.ARTIFACT_URL_TTL_S))
    return (int(now if now is not None else time.time()) // ttl + 2) * ttl


def signature(version_id: int, sha256: str, expires: int) -> str:
    message = f"{version_id}:{sha256}:{expires}"
    return salted_hmac(SIGN_SALT, message, algorithm="sha256").hexdigest()


def url_path(version_id: int, sha256: str) -> str:
    return f"/artifacts/v1/{version_id}/{sha256}.tar"


def signed_url(version: ModelVersion, now: float | None = None) -> str:
    base = str(settings.PORTAL_INTERNAL_URL or "").rstrip("/")
    if not base:
        raise ImproperlyConfigured(
            "ARTIFACT_DELIVERY=portal needs PORTAL_INTERNAL_URL: the portal's address as the "
            "Ray nodes reach it (for example http://portal.internal:8000)"
        )
    expires = url_expiry(now)
    sig = signature(version.pk, version.sha256, expires)
    return f"{base}{url_path(version.pk, version.sha256)}?exp={expires}&sig={sig}"


def check_signature(
    version_id: int, sha256: str, expires: str, sig: str, now: float | None = None
) -> str:
    """Why this URL is refused, or "" when it is signed and not expired."""
    if not expires or not sig:
        return "it has no signature (exp and sig)"
    try:
        exp = int(expires)
    except (TypeError, ValueError):
        return "its signature's exp is not a number"
    if not hmac.compare_digest(signature(version_id, sha256, exp), str(sig)):
        return "the signature does not match"
    if exp < (now if now is not None else time.time()):
        return "the signature has expired"
    return ""


def servable(version_id: int, sha256: str) -> ModelVersion | None:
    """The ready version a signed URL names (its checksum must still be the version's)."""
    return (
        ModelVersion.objects.filter(pk=version_id, sha256=sha256, status=VersionStatus.READY)
        .select_related("tenant")
        .first()
    )


# --- S3-compatible storage (ARTIFACT_DELIVERY=s3) -------------------------------------------


def s3_key(sha256: str) -> str:
    return f"{settings.ARTIFACT_S3_PREFIX}{sha256}.tar"


def s3_client() -> Any:
    import boto3  # only where S3 is configured

    return boto3.client(
        "s3",
        endpoint_url=settings.ARTIFACT_S3_ENDPOINT_URL or None,
        region_name=settings.ARTIFACT_S3_REGION or None,
    )


def publish_s3(version: ModelVersion, client: Any = None) -> bool:
    """Upload the version's tar unless the bucket has it (by checksum); True when uploaded."""
    from botocore.exceptions import ClientError

    if version.sha256 in _published:
        return False
    client = client or s3_client()
    bucket, key = settings.ARTIFACT_S3_BUCKET, s3_key(version.sha256)
    try:
        client.head_object(Bucket=bucket, Key=key)
        _published.add(version.sha256)
        return False
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
    directory = artifacts.local_directory(version.artifact_uri)
    started = time.monotonic()
    with tempfile.NamedTemporaryFile(dir=artifacts.staging_dir(), suffix=".tar") as handle:
        for chunk in stream_tar(tar_entries(directory)):
            handle.write(chunk)
        handle.flush()
        size = handle.tell()
        extra = {"Metadata": {"sha256": version.sha256}}
        client.upload_file(handle.name, bucket, key, ExtraArgs=extra)
    _published.add(version.sha256)
    took = time.monotonic() - started
    logger.info("artifact uploaded to s3://%s/%s (%d bytes in %.1f s)", bucket, key, size, took)
    return True


def publish(versions: Iterable[ModelVersion]) -> int:
    """Make each version fetchable where replicas look for it (S3 uploads); how many sent."""
    if settings.ARTIFACT_DELIVERY != "s3":
        return 0
    client = s3_client()
    return sum(publish_s3(v, client) for v in {v.sha256: v for v in versions}.values())


# --- what a replica is told --------------------------------------------------------------------


def source(version: ModelVersion, now: float | None = None) -> dict[str, Any] | None:
    """Where replicas fetch the version from (None: read it in place, ARTIFACT_DELIVERY=path)."""
    mode = settings.ARTIFACT_DELIVERY
    if mode == "path":
        return None
    common = {"sha256": version.sha256, "bytes": int(version.size_bytes or 0)}
    if mode == "portal":
        return {"via": "portal", "url": signed_url(version, now), **common}
    return {
        "via": "s3",
        "bucket": settings.ARTIFACT_S3_BUCKET,
        "key": s3_key(version.sha256),
        "endpoint_url": settings.ARTIFACT_S3_ENDPOINT_URL,
        "region": settings.ARTIFACT_S3_REGION,
        **common,
    }


def artifact_ref(version: ModelVersion) -> str:
    """What the Serve config names as the artifact: the directory to read in place, or (with a
    source) the version's URI, a name that says which weights without being read."""
    if settings.ARTIFACT_DELIVERY == "path":
        return str(artifacts.local_directory(version.artifact_uri))
    return version.artifact_uri or f"sha256:{version.sha256}"
