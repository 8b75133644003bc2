"""The demo's tiny Llama is trained until its loss target, not for a wall-clock time, so a busy
machine trains the same weights; one that stops short says so and is never kept for reuse."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from portal.management.commands import demo_tenant


def test_a_checkpoint_that_missed_its_loss_target_is_reported_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("PORTAL_DEMO_MODEL_CACHE", str(cache))
    monkeypatch.setattr(demo_tenant, "DEMO_TRAIN_SECONDS", 0.0)  # stops before its target
    out, err = io.StringIO(), io.StringIO()
    command = demo_tenant.Command(stdout=out, stderr=err)

    directory = command.demo_checkpoint(tmp_path / "model", variant=1)

    assert all((directory / name).is_file() for name in demo_tenant.CHECKPOINT_FILES)
    assert "Training the demo's tiny Llama" in out.getvalue()
    assert "did not reach its loss target" in err.getvalue()
    assert list(cache.iterdir()) == []  # the next data folder trains again
