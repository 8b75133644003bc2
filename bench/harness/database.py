"""The benchmark's own PostgreSQL test database, made and dropped through Django's
test-database machinery; real data is never touched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit


def _admin_params(db: dict[str, Any]) -> dict[str, Any]:
    params = {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "dbname": "postgres",
    }
    return {k: v for k, v in params.items() if v}


def ensure_base_database(settings: Any = None) -> None:
    """Create the base database of DATABASE_URL if missing (the test DB is derived from it)."""
    import psycopg
    from psycopg import sql

    if settings is None:
        from django.conf import settings
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit(f"This benchmark needs PostgreSQL; DATABASE_URL gives {db['ENGINE']}.")
    with psycopg.connect(**_admin_params(db), autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if found.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
            print(f"created base database {db['NAME']}")


def terminate_backends(db: dict[str, Any], name: str) -> None:
    """Close what is left connected to `name` (a killed child's backends), so that DROP
    DATABASE does not wait on them."""
    import psycopg

    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(**_admin_params(db), autocommit=True) as conn,
    ):
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )


def bench_database_name(base: str, scenario: str) -> str:
    """`test_<base>_<scenario>`, with `bench` in it when the base has none: it can never be a
    test run's own `test_<base>` (or xdist's `test_<base>_gw<n>`)."""
    return f"test_{base}_{scenario}" if "bench" in base else f"test_{base}_bench_{scenario}"


def database_url(name: str) -> str:
    """DATABASE_URL of this process with `name` as the database (for children)."""
    import os

    return urlsplit(os.environ["DATABASE_URL"])._replace(path=f"/{name}").geturl()


@contextlib.contextmanager
def test_database(scenario: str, *, debug: bool = False) -> Iterator[str]:
    """A fresh, migrated `bench_database_name(...)` for the block; dropped after it (also on
    errors). DEBUG stays off, as in production."""
    from django.conf import settings
    from django.db import connection, connections
    from django.test.utils import setup_test_environment, teardown_test_environment

    ensure_base_database(settings)
    setup_test_environment(debug=debug)
    db = settings.DATABASES["default"]
    old_name = db["NAME"]
    db.setdefault("TEST", {})["NAME"] = bench_database_name(old_name, scenario)
    try:
        name = connection.creation.create_test_db(
            verbosity=0, autoclobber=True, keepdb=False, serialize=False
        )
    except BaseException:
        teardown_test_environment()
        raise
    try:
        yield name
    finally:
        connections.close_all()
        terminate_backends(db, name)
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)
        teardown_test_environment()
