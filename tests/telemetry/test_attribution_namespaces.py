"""GPU attribution in containers: a replica in a pid namespace of its own (as in a KubeRay pod)
reports a pid that NVML, and an agent on the host, never see; the agent maps NVML's pid to the
replica through what survives namespaces (serving.dataplane.identity). Tested with a real pid
namespace (`unshare --pid`) and the simulated provider showing the host's pid, as NVML does."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.dataplane import identity
from serving.telemetry.agent.attribution import Owner, attribute
from serving.telemetry.providers.base import GpuProcess
from serving.telemetry.providers.simulated import SimulatedProvider

OWNERS = {"acme.chat": Owner(7, "acme", 70, "chat"), "globex.chat": Owner(8, "globex", 80, "chat")}
# A stand-in replica: prints the pid and pid namespace it sees, then waits.
_REPLICA = (
    "import os, sys; print(os.getpid(), os.readlink('/proc/self/ns/pid'), flush=True); "
    "sys.stdin.read()"
)


@pytest.fixture
def contained() -> Iterator[tuple[int, dict[str, Any]]]:
    """(host pid, what the process itself reports) of a process in a new pid namespace."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("the namespace test needs util-linux's unshare")
    process = subprocess.Popen(  # noqa: S603 (fixed argv)
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", _REPLICA],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        assert len(line) == 2, f"the contained process said {line}"
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        deadline = time.monotonic() + 10
        while not children.read_text().split():
            assert time.monotonic() < deadline, "unshare started no child"
            time.sleep(0.05)
        host_pid = int(children.read_text().split()[0])
        yield host_pid, {"pid": int(line[0]), "pidns": line[1]}
    finally:
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        process.wait(timeout=10)


def test_a_replica_in_its_own_pid_namespace_is_found_by_the_host_agent(
    contained: tuple[int, dict[str, Any]],
) -> None:
    host_pid, reported = contained
    assert reported["pid"] != host_pid  # the numbers differ: matching by pid would miss it
    assert reported["pidns"] != identity.pid_namespace()
    assert identity.innermost_pid(host_pid) == reported["pid"]
    provider = SimulatedProvider(devices=2, seed=1)
    provider.attach(host_pid, 1, 3 << 30)  # NVML lists the host's pid
    replica = {"app": "acme.chat", "group": "stable", "replica": "r-in-pod", **reported}
    # A replica of another tenant in yet another namespace whose pid happens to be the host pid
    # of the first: a pid alone would attribute globex's GPU use to acme, or the reverse.
    decoy = {"app": "globex.chat", "group": "stable", "replica": "r-decoy",
             "pid": host_pid, "pidns": "pid:[4026531999]"}  # fmt: skip
    (row,) = attribute(provider.processes(), [decoy, replica], OWNERS)
    assert (row["pid"], row["tenant"], row["replica"]) == (host_pid, "acme", "r-in-pod")
    assert row["device_uuid"] == "SIM-GPU-1" and row["used_memory"] == 3 << 30


def test_the_same_namespace_still_matches_by_pid_and_older_replicas_too() -> None:
    here = identity.pid_namespace()
    processes = [GpuProcess(4_100_000, 0, "GPU-a", 1), GpuProcess(4_100_001, 0, "GPU-a", 1)]
    replicas = [
        # The agent cannot read this pid (an exited process): same namespace, same pid.
        {"app": "acme.chat", "replica": "same-ns", "pid": 4_100_000, "pidns": here},
        {"app": "globex.chat", "replica": "older", "pid": 4_100_001},  # published no namespace
    ]
    rows = attribute(processes, replicas, OWNERS)
    assert [(r["tenant"], r["replica"]) for r in rows] == [("acme", "same-ns"), ("globex", "older")]


def test_an_agent_that_cannot_see_the_process_attributes_a_device_one_replica_claims() -> None:
    unseen = [GpuProcess(4_200_000, 0, "GPU-5B2C", 2 << 30), GpuProcess(4_200_001, 1, "GPU-77", 1)]
    replicas = [
        {"app": "acme.chat", "replica": "a", "pid": 12, "pidns": "pid:[1]", "gpus": ["GPU-5b2c"]},
        {"app": "globex.chat", "replica": "b", "pid": 12, "pidns": "pid:[2]", "gpus": ["GPU-77"]},
        {"app": "acme.chat", "replica": "c", "pid": 13, "pidns": "pid:[3]", "gpus": ["GPU-77"]},
    ]
    rows = {r["device_uuid"]: r for r in attribute(unseen, replicas, OWNERS, lambda pid: None)}
    assert (rows["GPU-5B2C"]["tenant"], rows["GPU-5B2C"]["replica"]) == ("acme", "a")
    # Two replicas say they use GPU-77 and NVML shows one process: nobody's, not a guess.
    assert rows["GPU-77"]["tenant"] is None


def test_gpu_uuids_compare_in_nvmls_form() -> None:
    assert identity.gpu_uuid("58D6B1AD-0000-4C2E-9A11-5E0F00000001") == (
        "GPU-58d6b1ad-0000-4c2e-9a11-5e0f00000001"
    )
    assert identity.gpu_uuid("GPU-58d6b1ad") == identity.gpu_uuid("gpu-58D6B1AD")
    assert identity.process_identity() == {"pidns": identity.pid_namespace(), "gpus": []}
