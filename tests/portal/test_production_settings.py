"""Production settings come from the environment and pass `check --deploy` without warnings."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(env_overrides: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    dropped = ("DJANGO_SETTINGS_MODULE", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update({"DJANGO_SETTINGS_MODULE": "portal.settings", **env_overrides})
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


PRODUCTION = {
    "PORTAL_ENV": "production",
    "ALLOWED_HOSTS": "portal.example.com",
    "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal"),
    "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
}


def test_check_deploy_is_clean_with_production_settings() -> None:
    key = secrets.token_urlsafe(50)
    result = _run({**PRODUCTION, "SECRET_KEY": key}, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
    assert key not in result.stdout + result.stderr


def test_production_refuses_to_start_without_a_secret_key() -> None:
    result = _run(PRODUCTION, "check")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_production_refuses_to_start_without_allowed_hosts() -> None:
    env = {**PRODUCTION, "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": ""}
    result = _run(env, "check")
    assert result.returncode != 0
    assert "ALLOWED_HOSTS must be set" in result.stderr


def test_production_refuses_a_public_or_short_secret_key_and_writes_none(tmp_path: Path) -> None:
    data = {**PRODUCTION, "PORTAL_DATA_DIR": str(tmp_path)}
    for key in ("django-insecure-" + "x" * 50, "too-short"):
        result = _run({**data, "SECRET_KEY": key}, "check")
        assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr
    assert not (tmp_path / "secret_key").exists()  # production never makes one up


def test_an_existing_cluster_needs_the_portals_address_for_its_nodes() -> None:
    env = {
        **PRODUCTION,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "RAY_ADDRESS": "10.1.2.3:6379",
        "ARTIFACT_DELIVERY": "",  # the default: `portal` against an existing cluster
    }
    result = _run(env, "check")
    assert result.returncode != 0
    assert "needs PORTAL_INTERNAL_URL" in result.stderr
    assert _run({**env, "PORTAL_INTERNAL_URL": "http://portal:8000"}, "check").returncode == 0
    bad = _run({**env, "ARTIFACT_DELIVERY": "nfs"}, "check")
    assert bad.returncode != 0 and "ARTIFACT_DELIVERY must be path, portal or s3" in bad.stderr


def test_the_planner_setting_is_added_to_the_database_urls_own_options() -> None:
    """`random_page_cost` joins the `options` a DATABASE_URL already carries, never replaces
    them (a `search_path` in the URL still applies)."""
    url = PRODUCTION["DATABASE_URL"].split("?")[0] + "?options=-c%20search_path%3Dpublic"
    code = "from django.conf import settings; print(settings.DATABASES['default']['OPTIONS'])"
    result = _run({"DATABASE_URL": url, "PG_RANDOM_PAGE_COST": "1.5"}, "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    assert "'options': '-c search_path=public -c random_page_cost=1.5'" in result.stdout
