"""No constant secrets: SECRET_KEY and the KV secret are random, made once under the data dir
(0600, one value for every process), and the KV secret rotates without a restart."""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from incidents.drills.faults.kv_probe import drill_probe_key
from portal import secrets
from serving.dataplane.keys import hash_key
from serving.deployments.keys import cache_salt_hex, probe_key, probe_key_hashes

ROOT = Path(__file__).resolve().parents[2]
DROPPED = ("DJANGO_SETTINGS_MODULE", "SECRET_KEY", "KV_CACHE_SECRET", "PORTAL_ENV")


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update({"DJANGO_SETTINGS_MODULE": "portal.settings", "PORTAL_DATA_DIR": str(data_dir)})
    return env


def _start_settings(data_dir: Path) -> subprocess.Popen[str]:
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(data_dir), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _keys_of(processes: list[subprocess.Popen[str]]) -> list[str]:
    keys = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        keys.append(out.strip())
    return keys


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_processes_starting_together_make_and_share_one_private_secret_key(
    tmp_path: Path,
) -> None:
    web, worker, beat = _keys_of([_start_settings(tmp_path) for _ in range(3)])
    path = tmp_path / "secret_key"
    assert web == worker == beat == path.read_text().strip()
    assert len(web) >= 50 and _mode(path) == 0o600
    assert _keys_of([_start_settings(tmp_path)]) == [web]  # a restart keeps it
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # nothing left over


def test_no_constant_secret_key(tmp_path: Path) -> None:
    first, second = _keys_of([_start_settings(tmp_path / "a"), _start_settings(tmp_path / "b")])
    assert first != second  # a public default would be the same everywhere
    tree = ast.parse((ROOT / "portal" / "settings.py").read_text())
    assigned = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SECRET_KEY" for t in node.targets)
    ]
    assert assigned
    for value in assigned:  # neither a literal nor an env lookup with a literal default
        literals = [
            n.value
            for n in ast.walk(value)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value
        ]
        assert literals in ([], ["SECRET_KEY"]), ast.unparse(value)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "DEV_SECRET_KEY" not in names


def test_two_creators_racing_agree_on_the_winner(tmp_path: Path) -> None:
    """Both miss the file and stage their own; the hard link lets exactly one in."""
    path = tmp_path / "secret_key"
    made: list[str] = []

    def slow_make() -> str:
        made.append(value := secrets.new_secret())
        time.sleep(0.2)  # both are past the first read by now
        return value

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(secrets.read_or_create(path, slow_make)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 2 and made[0] != made[1]
    assert results[0] == results[1] == path.read_text() and results[0] in made


def test_a_secret_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret_key"
    key = secrets.secret_key(path)
    assert secrets.secret_key(path) == key
    path.chmod(0o644)
    with pytest.raises(ImproperlyConfigured, match="readable by other users"):
        secrets.secret_key(path)
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(ImproperlyConfigured, match="no usable secret key"):
        secrets.secret_key(path)


# --- the KV secret -------------------------------------------------------------------------


@pytest.fixture
def kv_file(settings: Any, tmp_path: Path) -> Path:
    settings.KV_CACHE_SECRET = ""
    settings.KV_CACHE_SECRET_PREVIOUS = ""
    settings.KV_SECRET_FILE = tmp_path / "kv_secret"
    return Path(settings.KV_SECRET_FILE)


def test_the_kv_secret_is_made_on_first_use_apart_from_the_secret_key(
    kv_file: Path, settings: Any
) -> None:
    (secret,) = secrets.kv_secrets()
    assert kv_file.exists() and _mode(kv_file) == 0o600
    assert len(secret) >= 50 and secret != settings.SECRET_KEY.encode()
    assert secrets.kv_secrets() == [secret]


def test_rotation_changes_salts_and_keeps_the_old_probe_key_valid_during_grace(
    kv_file: Path,
) -> None:
    salt1, key1 = cache_salt_hex(3), probe_key(9)
    assert probe_key_hashes(9) == [hash_key(key1)]
    drill1 = drill_probe_key(5)

    secrets.kv_rotate()
    salt2, key2 = cache_salt_hex(3), probe_key(9)
    assert salt2 != salt1  # old prefix-cache blocks are unreachable
    hashes = probe_key_hashes(9)
    assert len(hashes) == 2 and hash_key(key1) == hashes[1]  # the router keeps accepting it
    assert key2 == key1  # probes keep using the key the router held before the reconcile
    assert drill_probe_key(5) == drill1
    assert cache_salt_hex(4) != salt2 and probe_key_hashes(10) != hashes  # still per id

    secrets.kv_rotate()  # a third secret: the first one is dropped
    hashes3 = probe_key_hashes(9)
    assert len(hashes3) == 2 and hash_key(key1) not in hashes3
    assert hashes3[1] == hashes[0]  # the second secret is now the previous one
    assert hash_key(probe_key(9)) in hashes  # accepted by the routers still on the last config
    assert cache_salt_hex(3) not in (salt1, salt2)

    secrets.kv_end_grace()
    assert probe_key_hashes(9) == [hashes3[0]] == [hash_key(probe_key(9))]


def test_rotation_without_grace_revokes_the_previous_secret(kv_file: Path) -> None:
    old = probe_key_hashes(9)
    state = secrets.kv_rotate(keep_previous=False)
    assert state.previous is None and probe_key_hashes(9) != old
    assert len(probe_key_hashes(9)) == 1


def test_every_process_sees_a_rotation_without_a_restart(kv_file: Path) -> None:
    before = secrets.kv_secrets()
    code = (
        "import sys; from pathlib import Path; from portal.secrets import rotate_kv_file; "
        "rotate_kv_file(Path(sys.argv[1]))"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(kv_file)], cwd=ROOT, check=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
    )  # fmt: skip
    deadline = time.monotonic() + 1.0
    while secrets.kv_secrets() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    after = secrets.kv_secrets()
    assert len(after) == 2 and after[1] == before[0] and after[0] != before[0]
    assert _mode(kv_file) == 0o600


def test_an_unreadable_kv_file_is_a_clear_error(kv_file: Path) -> None:
    kv_file.write_text("not json")
    kv_file.chmod(0o600)
    with pytest.raises(ImproperlyConfigured, match="not the KV secret file"):
        secrets.kv_secrets()
    kv_file.write_text('{"current": "short"}')
    with pytest.raises(ImproperlyConfigured, match="at least 32 characters"):
        secrets.kv_secrets()


def test_a_kv_secret_from_the_environment_is_used_and_rotated_there(settings: Any) -> None:
    settings.KV_CACHE_SECRET = "n" * 40
    settings.KV_CACHE_SECRET_PREVIOUS = "o" * 40
    assert secrets.kv_secrets() == [b"n" * 40, b"o" * 40]
    assert secrets.probe_secret() == b"o" * 40 and secrets.kv_secret() == b"n" * 40
    with pytest.raises(secrets.SecretNotRotatable, match="KV_CACHE_SECRET_PREVIOUS"):
        secrets.kv_rotate()
    with pytest.raises(CommandError, match="set in the environment"):
        call_command("rotate_kv_secret")


# --- manage.py rotate_kv_secret --------------------------------------------------------------


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from serving.deployments.tasks import reconcile

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(reconcile, "delay", lambda *a, **kw: calls.append(kw))
    return calls


def test_the_command_rotates_and_reconciles_every_live_deployment(
    kv_file: Path, world_a: Any, enqueued: list[dict[str, Any]], capsys: Any
) -> None:
    before = secrets.kv_secrets()
    call_command("rotate_kv_secret")
    after = secrets.kv_secrets()
    assert after[1] == before[0] and after[0] != before[0]
    assert enqueued == [{"force": True}]
    assert "stays valid for probe keys until --end-grace" in capsys.readouterr().out

    call_command("rotate_kv_secret", "--end-grace")
    assert secrets.kv_secrets() == [after[0]]
    assert enqueued == [{"force": True}] * 2

    call_command("rotate_kv_secret", "--no-grace")
    assert len(secrets.kv_secrets()) == 1 and secrets.kv_secrets() != [after[0]]
    assert len(enqueued) == 3


def test_the_command_without_deployments_enqueues_nothing(
    kv_file: Path, db: Any, enqueued: list[dict[str, Any]], capsys: Any
) -> None:
    call_command("rotate_kv_secret")
    assert len(secrets.kv_secrets()) == 2 and enqueued == []
    assert "nothing to reconcile" in capsys.readouterr().out
