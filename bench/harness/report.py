"""What a benchmark prints and writes: its environment, a table, the results file."""

from __future__ import annotations

import contextlib
import json
import os
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness.env import RESULTS_DIR


def environment(*packages: str, database: bool = False, redis_url: str | None = None) -> dict:
    """Python, the versions of `packages`, CPUs and load; with `database`, the PostgreSQL
    server and the database in use (Django's connection); with `redis_url`, Redis' version."""
    versions = {}
    for package in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "packages": versions,
        "cpus": os.cpu_count(),
        "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
    }
    if database:
        from django.conf import settings
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            info["postgresql"] = cursor.fetchone()[0]
        info["database"] = settings.DATABASES["default"]["NAME"]
        info["debug"] = settings.DEBUG
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        try:
            info["redis"] = client.info("server").get("redis_version")
        finally:
            client.close()
        info["redis_url"] = redis_url
    return info


def print_table(rows: Sequence[Sequence[Any]], *, header: Sequence[str] | None = None) -> None:
    """Rows as aligned columns: the first left-aligned, the others right-aligned."""
    table = [[str(c) for c in row] for row in ([header] if header else []) + list(rows)]
    if not table:
        return
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(table[0]))]
    print()
    for row in table:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=False)
        ]
        print("  " + "  ".join(cells))


def results_path(name: str) -> Path:
    return RESULTS_DIR / f"{name}.json"


def write_results(name: str, result: dict[str, Any], path: Path | None = None) -> Path:
    """The results as JSON at `path` (default bench/results/<name>.json, gitignored)."""
    path = path or results_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path
