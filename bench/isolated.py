"""What every benchmark needs to stay off real data: its own PostgreSQL test database (made and
dropped through Django's test-database machinery) and its own Redis keys."""

from __future__ import annotations

from typing import Any


def ensure_base_database(settings: Any) -> None:
    """Create the base database of DATABASE_URL if missing (the test DB is derived from it)."""
    import psycopg
    from psycopg import sql

    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit(f"This benchmark needs PostgreSQL; DATABASE_URL gives {db['ENGINE']}.")
    params = {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "dbname": "postgres",
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if found.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
            print(f"created base database {db['NAME']}")


def clear_redis(url: str, *patterns: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for pattern in patterns:
        keys = list(client.scan_iter(pattern))
        if keys:
            client.delete(*keys)
