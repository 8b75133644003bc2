"""Secrets kept under the data dir, never constants: the development SECRET_KEY, and the KV
secret (prefix-cache salts, probe keys) that `manage.py rotate_kv_secret` rotates.

A missing file is created by whichever process comes first, complete and mode 0600: it is
written beside the target and hard-linked into place, which is atomic and fails when another
process won, so the web, worker and beat processes that share the data dir read one value.
The KV secret file is stat-ed on every read and parsed again when it changed, so a rotation
reaches every process at once, without a restart.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

MIN_SECRET_CHARS = 32
_StatKey = tuple[int, int, int, int]


def new_secret() -> str:
    return secrets.token_urlsafe(50)


class SecretNotRotatable(Exception):
    """The KV secret comes from the environment; the environment is where to rotate it."""


# --- private files ----------------------------------------------------------------------


def _read_private(path: Path) -> tuple[str, _StatKey]:
    """The file's text and what identifies this version of it; refuses a file other users can
    read (the secret would be theirs too)."""
    with open(path, encoding="utf-8") as handle:
        info = os.fstat(handle.fileno())
        if info.st_mode & 0o077:
            raise ImproperlyConfigured(
                f"{path} is readable by other users (mode {info.st_mode & 0o777:o}): "
                f"`chmod 600 {path}`, and rotate the secret if they may have read it."
            )
        text = handle.read()
    return text, (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)


def _write_private(directory: Path, text: str) -> Path:
    """A complete, synced 0600 file in `directory` (the target's filesystem: link and rename
    are atomic there)."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=".secret-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    """The file's text; created from `make()` when missing (one process's text wins)."""
    try:
        return _read_private(path)[0]
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = _write_private(path.parent, make())
    try:
        os.link(staged, path)
        _sync_directory(path.parent)
    except FileExistsError:
        pass  # another process created it first: read theirs
    finally:
        staged.unlink(missing_ok=True)
    return _read_private(path)[0]


def secret_key(path: Path) -> str:
    """Django's SECRET_KEY outside production: random, made on first run, kept in `path`."""
    key = read_or_create(path, new_secret).strip()
    if len(key) < MIN_SECRET_CHARS:
        raise ImproperlyConfigured(
            f"{path} holds no usable secret key (under {MIN_SECRET_CHARS} characters): delete "
            "it and a new one is made on the next start (sessions and signed links end)."
        )
    return key


# --- the KV secret: current, and the previous one during a rotation's grace ---------------


@dataclass(frozen=True)
class KvSecrets:
    current: str
    previous: str | None = None
    rotated_at: str | None = None

    def as_bytes(self) -> list[bytes]:
        """Current first, then the previous one while its grace lasts."""
        return [s.encode() for s in (self.current, self.previous) if s]

    def dump(self) -> str:
        return json.dumps(
            {"current": self.current, "previous": self.previous, "rotated_at": self.rotated_at},
            indent=1,
        )


def _parse(path: Path, text: str) -> KvSecrets:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{path} is not the KV secret file (not JSON): {exc}") from exc
    current = data.get("current") if isinstance(data, dict) else None
    previous = data.get("previous") if isinstance(data, dict) else None
    rotated_at = data.get("rotated_at") if isinstance(data, dict) else None
    for name, value in (("current", current), ("previous", previous)):
        if value is None and name == "previous":
            continue
        if not isinstance(value, str) or len(value) < MIN_SECRET_CHARS:
            raise ImproperlyConfigured(
                f"{path}: `{name}` must be a secret of at least {MIN_SECRET_CHARS} characters."
            )
    return KvSecrets(str(current), previous, rotated_at if isinstance(rotated_at, str) else None)


_cache: dict[Path, tuple[_StatKey, KvSecrets]] = {}
_cache_lock = threading.Lock()


def read_kv_file(path: Path) -> KvSecrets:
    """The KV secrets in `path` (created on first use); parsed again only when it changed."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        read_or_create(path, lambda: KvSecrets(new_secret()).dump())
        info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
    with _cache_lock:
        cached = _cache.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    text, read_key = _read_private(path)
    state = _parse(path, text)
    with _cache_lock:
        _cache[path] = (read_key, state)
    return state


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _replace_kv_file(path: Path, change: Callable[[KvSecrets], KvSecrets]) -> KvSecrets:
    """Read, change and atomically replace the file, one rotation at a time (a lock file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        state = change(read_kv_file(path))
        staged = _write_private(path.parent, state.dump())
        try:
            os.replace(staged, path)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        _sync_directory(path.parent)
        return state
    finally:
        os.close(lock_fd)  # releases the lock


def rotate_kv_file(path: Path, *, keep_previous: bool = True) -> KvSecrets:
    """A new current secret; the old one stays accepted for probe keys until the next
    rotation or `end_kv_grace_file` (keep_previous=False: revoked at once)."""
    return _replace_kv_file(
        path, lambda old: KvSecrets(new_secret(), old.current if keep_previous else None, _now())
    )


def end_kv_grace_file(path: Path) -> KvSecrets:
    """Stop accepting the previous secret."""
    return _replace_kv_file(path, lambda old: KvSecrets(old.current, None, old.rotated_at))


# --- what the rest of the portal calls -----------------------------------------------------


def _env_state() -> KvSecrets | None:
    from django.conf import settings

    current = str(getattr(settings, "KV_CACHE_SECRET", "") or "")
    if not current:
        return None
    previous = str(getattr(settings, "KV_CACHE_SECRET_PREVIOUS", "") or "") or None
    return KvSecrets(current, previous)


def kv_secret_file() -> Path:
    from django.conf import settings

    default = Path(settings.DATA_DIR) / "kv_secret"
    return Path(getattr(settings, "KV_SECRET_FILE", default))


def kv_state() -> KvSecrets:
    """KV_CACHE_SECRET (and KV_CACHE_SECRET_PREVIOUS) from the environment, else the file."""
    return _env_state() or read_kv_file(kv_secret_file())


def kv_secrets() -> list[bytes]:
    """Every accepted KV secret: the current one first, then the previous one (grace)."""
    return kv_state().as_bytes()


def kv_secret() -> bytes:
    """The current KV secret: the only one prefix-cache salts are derived from."""
    return kv_secrets()[0]


def probe_secret() -> bytes:
    """The secret probe keys are sent under: the oldest one still accepted. The routers were
    given its hash before the rotation, and get both hashes with the reconcile that follows,
    so a probe never fails between a rotation and that reconcile landing."""
    return kv_secrets()[-1]


def kv_rotate(*, keep_previous: bool = True) -> KvSecrets:
    if _env_state() is not None:
        raise SecretNotRotatable(
            "KV_CACHE_SECRET is set in the environment: put the new value there, the old one "
            "in KV_CACHE_SECRET_PREVIOUS, and restart every portal process."
        )
    return rotate_kv_file(kv_secret_file(), keep_previous=keep_previous)


def kv_end_grace() -> KvSecrets:
    if _env_state() is not None:
        raise SecretNotRotatable(
            "KV_CACHE_SECRET is set in the environment: unset KV_CACHE_SECRET_PREVIOUS there."
        )
    return end_kv_grace_file(kv_secret_file())
