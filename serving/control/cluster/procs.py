"""Processes and listening sockets, read from /proc: the head is found by its session, never by
process name (other Ray clusters may share the host), and stopped by PID in Ray's own order.
Listening sockets, read from /proc/net, are what the head exposes, for status and for the tests.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.control.cluster.config import DEFAULT_GRACE_S


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    session: int
    state: str
    start_ticks: int  # since boot; with the pid it names one process even after pid reuse
    name: str
    cmdline: str


def read_proc(pid: int) -> ProcInfo | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw_cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # comm is in parentheses and may itself contain spaces and parentheses.
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcInfo(
        pid=pid,
        ppid=int(fields[1]),
        session=int(fields[3]),
        state=fields[0],
        start_ticks=int(fields[19]),
        name=name,
        cmdline=raw_cmd.replace(b"\0", b" ").decode(errors="replace").strip(),
    )


def all_procs() -> Iterator[ProcInfo]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = read_proc(int(entry.name))
            if info is not None:
                yield info


def is_alive(pid: int, start_ticks: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.start_ticks == start_ticks and info.state not in ("Z", "X")


def _signal(info: ProcInfo, sig: signal.Signals) -> None:
    if is_alive(info.pid, info.start_ticks):  # never signal a pid that now names someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(info.pid, sig)


def _terminate(procs: Sequence[ProcInfo], grace: float) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL what is left and wait for it to go."""
    for info in procs:
        _signal(info, signal.SIGTERM)
    for sig, wait in ((signal.SIGKILL, grace), (None, 5.0)):
        deadline = time.monotonic() + wait
        alive = [p for p in procs if is_alive(p.pid, p.start_ticks)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if is_alive(p.pid, p.start_ticks)]
        if sig is None or not alive:
            return
        for info in alive:
            _signal(info, sig)


def stop_processes(procs: Iterable[ProcInfo], *, grace: float = DEFAULT_GRACE_S) -> None:
    """Stop in Ray's own order: raylets first (their workers go with them), GCS last."""
    procs = list(procs)
    raylets = [p for p in procs if p.name == "raylet"]
    gcs = [p for p in procs if p.name == "gcs_server"]
    others = [p for p in procs if p not in raylets and p not in gcs]
    for bucket in (raylets, others, gcs):
        if bucket:
            _terminate(bucket, grace)


# Listening sockets, read from /proc/net: what the head exposes, for status and for the tests.


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def decode_address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc/net/tcp{,6} prints each 32-bit word in host (little-endian) byte order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words)


def _listening_inodes() -> dict[int, tuple[str, int]]:
    inodes: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A":  # TCP_LISTEN
                    hex_addr, hex_port = cols[1].split(":")
                    inodes[int(cols[9])] = (decode_address(hex_addr), int(hex_port, 16))
    return inodes


def listening_sockets(pids: Iterable[int]) -> list[Listener]:
    """TCP sockets in LISTEN state held by these processes."""
    inodes = _listening_inodes()
    found: set[Listener] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inode = int(target[len("socket:[") : -1])
                        if inode in inodes:
                            address, port = inodes[inode]
                            found.add(Listener(pid, address, port))
    return sorted(found, key=lambda item: (item.port, item.pid))
