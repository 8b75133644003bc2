"""The embedded services (portal/embedded.py): the same PostgreSQL and a Redis-compatible
server, started from the pip packages on free loopback ports in a temporary folder, used
through the clients the portal uses, and stopped again."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psycopg
import pytest
import redis

from portal import embedded
from serving.control.cluster import listening_sockets


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_ports_come_from_the_environment_and_bad_ones_name_the_variable(tmp_path: Path) -> None:
    config = embedded.from_env(
        {
            "PORTAL_DATA_DIR": str(tmp_path),
            "PORTAL_EMBEDDED_PG_PORT": "55001",
            "PORTAL_EMBEDDED_REDIS_PORT": "",
        }
    )
    assert config.database_url == "postgres://postgres@127.0.0.1:55001/portal"
    assert config.redis_url == f"redis://127.0.0.1:{embedded.DEFAULT_REDIS_PORT}/0"
    assert config.pg_data == tmp_path.resolve() / "postgres"
    for bad in ("0", "70000", "5432x", "-1"):
        with pytest.raises(ValueError, match="PORTAL_EMBEDDED_PG_PORT"):
            embedded.from_env({"PORTAL_EMBEDDED_PG_PORT": bad})


def test_both_servers_start_answer_on_loopback_only_and_stop(tmp_path: Path) -> None:
    config = embedded.Embedded(
        data_dir=tmp_path / "var", pg_port=_free_port(), redis_port=_free_port()
    )
    ports = (config.pg_port, config.redis_port)
    try:
        embedded.start_daemons(config)
        embedded.start_daemons(config)  # idempotent: both already answer
        url = f"postgresql://postgres@127.0.0.1:{config.pg_port}/portal"
        with psycopg.connect(url) as conn:
            version = conn.execute("show server_version_num").fetchone()
            assert version is not None and int(version[0]) >= 180000
            assert conn.execute("show unix_socket_directories").fetchone() == ("",)
        client = redis.Redis.from_url(config.redis_url)
        assert client.set("k", "v") and client.get("k") == b"v"
        assert client.eval("return redis.call('incr', KEYS[1])", 1, "n") == 1  # Lua, as Celery

        pg_pid = int((config.pg_data / "postmaster.pid").read_text().split()[0])
        valkey_pid = int((config.redis_data / "valkey.pid").read_text().strip())
        listeners = listening_sockets({pg_pid, valkey_pid})
        assert {item.port for item in listeners} == {config.pg_port, config.redis_port}
        assert all(item.loopback for item in listeners), listeners
        if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as its system user
            import pwd

            owner = pwd.getpwuid(config.pg_data.stat().st_uid).pw_name
            assert owner == embedded.SYSTEM_USER
    finally:
        embedded.stop_daemons(config)
    deadline = time.monotonic() + 10
    while any(_listening(port) for port in ports) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_listening(port) for port in ports), "a server still listens after stop"
