"""BenchSession: an ExitStack whose teardowns run shielded from SIGINT/SIGTERM. Every resource
a benchmark starts through it registers its own teardown, which runs (last in, first out) when
the session ends, also on errors, Ctrl-C or `kill`."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import processes
from bench.harness.env import prefix_of
from bench.harness.redis import clear_prefix
from bench.harness.shield import interrupt_on_sigterm, shielded_cleanup


class BenchSession(contextlib.ExitStack):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.prefix = prefix_of(name)
        self.started = time.monotonic()

    def __enter__(self) -> BenchSession:
        interrupt_on_sigterm()
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        with shielded_cleanup():
            return bool(super().__exit__(*exc))

    # --- resources ------------------------------------------------------------------------

    def database(self, scenario: str | None = None) -> str:
        """A fresh migrated test database (dropped at the end); returns its name."""
        from bench.harness.database import test_database

        return self.enter_context(test_database(scenario or self.name))

    def redis(self, *patterns: str) -> None:
        """Clear the session's keys (its prefix, plus `patterns`) now and at the end."""
        url = os.environ["REDIS_URL"]
        every = (f"{self.prefix}:*", f"{self.prefix}*", *patterns)
        clear_prefix(url, *every)
        self.callback(clear_prefix, url, *every)

    def workdir(self) -> Path:
        work = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        self.callback(shutil.rmtree, work, True)
        return work

    def process(self, args: list[str], env: dict[str, str], log: Path, ready: str) -> Any:
        process = processes.start_process(args, env, log, ready)
        self.callback(processes.stop_process, process)
        return process

    def celery_worker(self, env: dict[str, str], log: Path, **kw: Any) -> Any:
        process = processes.celery_worker(env, log, **kw)
        self.callback(processes.stop_process, process)
        return process

    def celery_beat(self, env: dict[str, str], work: Path) -> Any:
        process = processes.celery_beat(env, work)
        self.callback(processes.stop_process, process)
        return process

    def ray_head(self, work: Path, *, num_cpus: int = 2) -> tuple[Any, Any]:
        """A local Ray head (127.0.0.1, its own ports, token auth), stopped by PID at the end;
        returns (config, target)."""
        from serving.control.cluster import local_target, start_head, stop_head

        config = processes.ray_head_config(work / "ray", num_cpus=num_cpus)
        print(f"starting the Ray head (GCS 127.0.0.1:{config.gcs_port}) ...", flush=True)

        def stop() -> None:
            stopped = stop_head(config)
            print(f"Ray head stopped ({len(stopped)} processes)", file=sys.stderr)

        self.callback(stop)
        start_head(config)
        return config, local_target(config)

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 1)
