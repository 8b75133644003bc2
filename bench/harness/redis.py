"""Clearing a benchmark's own Redis keys (its prefix only: never a whole db)."""

from __future__ import annotations


def clear_prefix(url: str, *patterns: str) -> int:
    """Delete every key matching `patterns` (e.g. `portal-bench-x:*`); returns how many."""
    import redis

    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(pattern, count=1000))
            for start in range(0, len(keys), 1000):
                deleted += client.delete(*keys[start : start + 1000])
    finally:
        client.close()
    return deleted
