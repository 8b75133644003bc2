"""A benchmark's own corner of the shared services: settings module, DATABASE_URL, REDIS_URL
(a Redis db of its own unless REDIS_URL is given) and key prefixes derived from its name."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/portal_bench"
# tests.settings plus prefixes taken from the environment (tests.settings fixes SLI_KEY_PREFIX)
# and Celery's queues under the bench's prefix (see bench/harness/settings.py).
BENCH_SETTINGS = "bench.harness.settings"


def prefix_of(name: str) -> str:
    return f"portal-bench-{name.replace('_', '-')}"


def isolate(name: str, redis_db: int, *, settings: str = BENCH_SETTINGS) -> str:
    """Point this process (and the children it starts, through os.environ) at the bench's own
    database base, Redis db and key prefixes; returns the prefix. DATABASE_URL and REDIS_URL
    from the environment win (the test suite passes its own); the prefixes are forced, since
    the run clears them."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    prefix = prefix_of(name)
    os.environ["DJANGO_SETTINGS_MODULE"] = settings  # forced: the isolation depends on it
    os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ.setdefault("REDIS_URL", f"redis://127.0.0.1:6379/{redis_db}")
    os.environ["BENCH_PREFIX"] = prefix
    os.environ["SLI_KEY_PREFIX"] = prefix
    os.environ["CACHE_KEY_PREFIX"] = prefix
    os.environ["CHANNEL_PREFIX"] = f"{prefix}:asgi"
    os.environ["RATE_LIMIT_KEY_PREFIX"] = f"{prefix}:rl"
    return prefix


def setup(name: str, redis_db: int, *, settings: str = BENCH_SETTINGS) -> str:
    """`isolate()`, then `django.setup()`; returns the prefix."""
    prefix = isolate(name, redis_db, settings=settings)
    import django

    django.setup()
    return prefix
