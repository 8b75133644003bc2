"""The artifact store: uploads streamed to disk under a size limit and unpacked safely, and
local checkpoint paths checked against the allowed roots.

Layout: `ARTIFACT_STORE_DIR/tenant-<id>/<random>/` holds one unpacked checkpoint (URI
`store://tenant-<id>/<random>`); `ARTIFACT_STORE_DIR/.staging/` holds uploads in flight, on the
same filesystem so that installing an unpacked upload is one rename.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import re
import shutil
import tarfile
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from django.conf import settings

from portal.exceptions import PayloadTooLarge, ValidationFailed

STORE_SCHEME = "store://"
FILE_SCHEME = "file://"
CHUNK_BYTES = 1 << 20
MAX_MEMBERS = 10_000
UPLOAD_CONTENT_TYPES = frozenset(
    {
        "application/x-tar",
        "application/tar",
        "application/x-gtar",
        "application/gzip",
        "application/x-gzip",
        "application/octet-stream",
    }
)
# Request paths whose bodies are artifact uploads (portal.bodylimit caps them in ASGI).
API_UPLOAD_PATH = r"^/api/v1/models/[0-9]+/versions/upload/$"
PAGE_UPLOAD_PATH = r"^/t/[-\w]+/models/[0-9]+/upload/$"
MULTIPART_SLACK_BYTES = 1 << 20  # the page form's other fields and multipart boundaries
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class ArtifactRejected(Exception):
    """An artifact the store refuses (unsafe or unusable archive, path gone); `reason` says why."""

    def __init__(self, reason: str, *, field: str = "artifact") -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True)
class ReceivedUpload:
    path: Path
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class UnpackedArtifact:
    workdir: Path  # staging folder to remove afterwards
    root: Path  # the Hugging Face layout inside it (workdir or its single top folder)


def store_dir() -> Path:
    return Path(settings.ARTIFACT_STORE_DIR).resolve()


def staging_dir() -> Path:
    path = store_dir() / ".staging"
    path.mkdir(parents=True, exist_ok=True)
    return path


def upload_limit() -> int:
    return int(settings.ARTIFACT_UPLOAD_MAX_BYTES)


def upload_body_limits() -> list[tuple[str, Callable[[], int]]]:
    """(path pattern, byte limit) of each upload route, for portal.bodylimit."""
    return [
        (API_UPLOAD_PATH, upload_limit),
        (PAGE_UPLOAD_PATH, lambda: upload_limit() + MULTIPART_SLACK_BYTES),
    ]


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The upload is larger than the limit of {limit} bytes (ARTIFACT_UPLOAD_MAX_BYTES).",
        field="artifact",
    )


def discard(path: Path) -> None:
    """Remove a staging file or folder (never fails: cleanup must not hide the real error)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# --- local paths ---------------------------------------------------------------------------


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_local_path(raw: str) -> Path:
    """The resolved directory a client may register, or ValidationFailed naming `path`.

    Only directories under ARTIFACT_LOCAL_ROOTS qualify (after resolving symlinks), and never
    the artifact store or a folder containing it: another tenant's uploads live there."""
    text = (raw or "").strip()
    if text.startswith(FILE_SCHEME):
        text = text[len(FILE_SCHEME) :]
    if not text:
        raise ValidationFailed("Give the checkpoint directory's absolute path.", field="path")
    if "\x00" in text or len(text) > 900:
        raise ValidationFailed("This is not a usable path.", field="path")
    candidate = Path(text)
    if not candidate.is_absolute():
        raise ValidationFailed(f"{text} is not an absolute path.", field="path")
    roots = [Path(r).resolve() for r in settings.ARTIFACT_LOCAL_ROOTS]
    if not roots:
        raise ValidationFailed(
            "Registering local paths is disabled on this portal (ARTIFACT_LOCAL_ROOTS is "
            "empty); upload the checkpoint as a tar archive instead.",
            field="path",
        )
    resolved = candidate.resolve()
    store = store_dir()
    if _is_within(resolved, store) or _is_within(store, resolved):
        raise ValidationFailed(
            f"{text} is in or above the portal's artifact store; register a checkpoint "
            "directory of your own, or upload it.",
            field="path",
        )
    if not any(_is_within(resolved, root) for root in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise ValidationFailed(
            f"{text} is outside the allowed artifact roots ({allowed}); the platform team sets "
            "them with ARTIFACT_LOCAL_ROOTS.",
            field="path",
        )
    if not resolved.is_dir():
        raise ValidationFailed(f"{text} does not exist or is not a directory.", field="path")
    return resolved


def file_uri(path: Path) -> str:
    return FILE_SCHEME + path.as_posix()


def local_directory(uri: str) -> Path:
    """The directory an artifact URI names on this machine; ArtifactRejected if unusable."""
    if uri.startswith(STORE_SCHEME):
        store = store_dir()
        path = (store / uri[len(STORE_SCHEME) :]).resolve()
        if not _is_within(path, store) or path == store:
            raise ArtifactRejected(f"{uri} points outside the artifact store")
        return path
    if uri.startswith(FILE_SCHEME):
        try:
            directory = check_local_path(uri)
        except ValidationFailed as exc:
            raise ArtifactRejected(exc.message, field="path") from None
        _refuse_symlinks(directory)
        return directory
    raise ArtifactRejected(f"unknown artifact URI scheme in {uri!r}")


def _refuse_symlinks(directory: Path) -> None:
    """A registered directory must not link outside itself. The engine's checksum refuses
    file symlinks but skips symlinked folders, so every entry is checked here."""
    for parent, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            path = Path(parent) / name
            if path.is_symlink():
                raise ArtifactRejected(f"{path.relative_to(directory)} is a symlink")


# --- uploads -------------------------------------------------------------------------------


def receive_upload(
    stream: Readable, *, content_length: int | None, max_bytes: int | None = None
) -> ReceivedUpload:
    """Copy a request body to a staging file chunk by chunk, enforcing the size limit as the
    bytes arrive (a declared Content-Length over the limit is refused before reading)."""
    limit = upload_limit() if max_bytes is None else max_bytes
    if content_length is not None and content_length > limit:
        raise _too_large(limit)
    target = staging_dir() / f"incoming-{uuid.uuid4().hex}.part"
    digest = hashlib.sha256()
    size = 0
    try:
        with target.open("xb") as handle:
            while chunk := stream.read(CHUNK_BYTES):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                digest.update(chunk)
                handle.write(chunk)
    except BaseException:
        discard(target)
        raise
    if size == 0:
        discard(target)
        raise ValidationFailed(
            "The request body is empty: send the tar archive as the body.", field="artifact"
        )
    return ReceivedUpload(path=target, size_bytes=size, sha256=digest.hexdigest())


def _member_parts(name: str) -> tuple[str, ...]:
    if "\x00" in name:
        raise ArtifactRejected(f"archive member {name!r} has a NUL byte in its name")
    if name.startswith(("/", "\\")) or _WINDOWS_DRIVE.match(name):
        raise ArtifactRejected(f"archive member {name!r} has an absolute path")
    parts = tuple(p for p in PurePosixPath(name).parts if p not in ("", "."))
    if ".." in parts:
        raise ArtifactRejected(f"archive member {name!r} points outside the artifact (..)")
    return parts


def _kind_refused(member: tarfile.TarInfo) -> str | None:
    if member.issparse():  # a few header bytes that unpack to any number of zeros
        return f"archive member {member.name!r} is a sparse file"
    if member.issym():
        return f"archive member {member.name!r} is a symlink (to {member.linkname!r})"
    if member.islnk():
        return f"archive member {member.name!r} is a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return f"archive member {member.name!r} is a device file"
    if member.isfifo():
        return f"archive member {member.name!r} is a FIFO"
    if not (member.isreg() or member.isdir()):
        return f"archive member {member.name!r} is not a regular file or directory"
    return None


@dataclass(frozen=True)
class ArchiveContents:
    """What an archive would unpack to, read from its member headers alone."""

    unpacked_bytes: int  # sum of the regular files' sizes: what the store would hold
    members: int


_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def _unreadable(exc: BaseException) -> ArtifactRejected:
    return ArtifactRejected(f"the upload is not a readable tar or tar.gz archive ({exc})")


def _over_unpack_limit(max_bytes: int) -> ArtifactRejected:
    return ArtifactRejected(
        f"the archive unpacks to more than {max_bytes} bytes (ARTIFACT_UPLOAD_MAX_BYTES)"
    )


def scan_archive(archive_path: Path, *, max_bytes: int | None = None) -> ArchiveContents:
    """Read every member header of a tar / tar.gz without writing anything, refusing what
    unpacking would refuse (paths, links, devices, sparse files, duplicates, more than
    MAX_MEMBERS entries) and an unpacked total over `max_bytes` (a small archive of zeros
    can expand a thousandfold): the caller charges `unpacked_bytes` to the tenant's storage
    quota before a byte is extracted."""
    limit = upload_limit() if max_bytes is None else max_bytes
    total = 0
    count = 0
    files: set[tuple[str, ...]] = set()
    try:
        with tarfile.open(archive_path, mode="r:*") as archive:
            for position, member, parts in _members(archive):
                count = position
                if not member.isreg():
                    continue
                if parts in files:
                    raise ArtifactRejected(
                        f"archive member {member.name!r} appears twice or clashes with another "
                        "entry"
                    )
                files.add(parts)
                total += member.size
                if total > limit:
                    raise _over_unpack_limit(limit)
    except _ARCHIVE_ERRORS as exc:
        raise _unreadable(exc) from None
    return ArchiveContents(unpacked_bytes=total, members=count)


def _members(archive: tarfile.TarFile) -> Iterator[tuple[int, tarfile.TarInfo, tuple[str, ...]]]:
    """(position, member, path parts) of every member the scan and the extraction accept:
    at most MAX_MEMBERS, none of a refused kind; members with no path (`.`) are skipped."""
    for count, member in enumerate(archive, start=1):
        if count > MAX_MEMBERS:
            raise ArtifactRejected(f"the archive holds more than {MAX_MEMBERS} entries")
        refused = _kind_refused(member)
        if refused:
            raise ArtifactRejected(refused)
        parts = _member_parts(member.name)
        if parts:
            yield count, member, parts


def _extract(archive: tarfile.TarFile, dest: Path, max_bytes: int) -> None:
    total = 0
    for _, member, parts in _members(archive):
        target = dest.joinpath(*parts)
        try:
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            if source is None:
                raise ArtifactRejected(f"archive member {member.name!r} has no content")
            with source, target.open("xb") as handle:
                while chunk := source.read(CHUNK_BYTES):
                    total += len(chunk)
                    if total > max_bytes:
                        raise _over_unpack_limit(max_bytes)
                    handle.write(chunk)
        except (FileExistsError, NotADirectoryError):
            raise ArtifactRejected(
                f"archive member {member.name!r} appears twice or clashes with another entry"
            ) from None


def _layout_root(dest: Path) -> Path:
    if (dest / "config.json").is_file():
        return dest
    entries = sorted(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "config.json").is_file():
        return entries[0]
    found = ", ".join(e.name for e in entries[:5]) or "nothing"
    raise ArtifactRejected(
        f"the archive holds no config.json at its root or in a single top folder (found: {found})"
    )


def unpack_upload(archive_path: Path, *, max_bytes: int | None = None) -> UnpackedArtifact:
    """Unpack a tar or tar.gz into a fresh staging folder; refuse absolute paths, `..`,
    symlinks, hard links, devices, sparse files and anything but regular files and folders.
    On any refusal the staging folder is removed and ArtifactRejected says which member and
    why. (Call `scan_archive` first: this counts bytes as they are written, as a backstop.)"""
    limit = upload_limit() if max_bytes is None else max_bytes
    workdir = staging_dir() / f"unpack-{uuid.uuid4().hex}"
    workdir.mkdir()
    try:
        try:
            with tarfile.open(archive_path, mode="r:*") as archive:
                _extract(archive, workdir, limit)
        except _ARCHIVE_ERRORS as exc:
            raise _unreadable(exc) from None
        root = _layout_root(workdir)
    except BaseException:
        discard(workdir)
        raise
    return UnpackedArtifact(workdir=workdir, root=root)


def install(unpacked: UnpackedArtifact, *, tenant_id: int) -> tuple[str, Path]:
    """Move an unpacked checkpoint into the store (one rename); returns its URI and path."""
    relative = f"tenant-{tenant_id}/{uuid.uuid4().hex}"
    final = store_dir() / relative
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(unpacked.root, final)
    discard(unpacked.workdir)
    return STORE_SCHEME + relative, final


def remove_stored(uri: str) -> None:
    """Delete an uploaded artifact from the store; registered local paths are never touched."""
    if not uri.startswith(STORE_SCHEME):
        return
    try:
        path = local_directory(uri)
    except ArtifactRejected:
        return
    discard(path)
