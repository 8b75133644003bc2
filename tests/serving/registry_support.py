"""Helpers of the model registry tests: tiny checkpoints, hand-made tar archives, the store."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from serving.engine.testing import write_tiny_checkpoint


def checkpoint(directory: Path, how: str = "good", *, seed: int = 0) -> Path:
    """A tiny checkpoint, good or broken in one way (the way the registry must report)."""
    write_tiny_checkpoint(directory, seed=seed)
    weights = directory / "model.safetensors"
    config_path = directory / "config.json"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "architecture":
        config = json.loads(config_path.read_text())
        config_path.write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    elif how == "shape":
        config = json.loads(config_path.read_text())
        config_path.write_text(json.dumps({**config, "intermediate_size": 96}))
    elif how == "no-tokenizer":
        (directory / "tokenizer.json").unlink()
    elif how == "symlink":
        (directory / "extra.bin").symlink_to(config_path)
    else:
        assert how == "good", how
    return directory


def tar_of(directory: Path, *, top: str | None = None, gz: bool = False) -> bytes:
    """The directory as a tar (or tar.gz), at the archive root or under one top folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as archive:
        archive.add(directory, arcname=top or ".")
    return buffer.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def hostile_tar(directory: Path, how: str) -> bytes:
    """A good checkpoint plus one hostile member (or a broken archive)."""
    if how == "not-a-tar":
        return b"this is not an archive\n" * 50
    if how == "truncated-gz":
        return tar_of(directory, gz=True)[:2000]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if how == "no-config":
            archive.addfile(*_info("weights/model.safetensors", data=b"x" * 10))
        elif how == "two-top-folders":
            archive.add(directory, arcname="a")
            archive.add(directory, arcname="b")
        else:
            archive.add(directory, arcname=".")
        extra = {
            "traversal": _info("../evil", data=b"owned"),
            "nested-traversal": _info("sub/../../evil", data=b"owned"),
            "absolute": _info("/evil-absolute", data=b"owned"),
            "symlink": _info("link", tarfile.SYMTYPE, link="/etc/passwd"),
            "hardlink": _info("hard", tarfile.LNKTYPE, link="config.json"),
            "device": _info("dev", tarfile.CHRTYPE),
            "fifo": _info("pipe", tarfile.FIFOTYPE),
            "duplicate": _info("config.json", data=b"{}"),
        }.get(how)
        if extra is not None:
            archive.addfile(*extra)
    return buffer.getvalue()


def stored_files(store: Path) -> list[str]:
    """Every file (not folder) under the store, relative: a refused upload must leave none."""
    if not store.exists():
        return []
    return sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if not p.is_dir())
