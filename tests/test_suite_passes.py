"""How the suite is split (tests/conftest.py): a Ray test never runs on an xdist worker, where
each worker would start a Ray head of its own beside the other's tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_ray_test_on_an_xdist_worker_is_skipped_with_the_command_that_runs_it() -> None:
    result = subprocess.run(  # noqa: S603 (this interpreter's pytest on one of our tests)
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/portal/test_healthz.py",
            "-m",
            "ray",
            "-n",
            "1",
            "-p",
            "no:cacheprovider",
            "-rs",
            "-q",
            "--no-header",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-2000:]
    assert "1 skipped" in out and "pytest -m 'ray or vllm'" in out, out[-2000:]
