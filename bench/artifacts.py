"""Benchmark: a model version's files to a Ray node through the portal (ARTIFACT_DELIVERY=portal)
against a copy on the same disk, measured in the same run.

A checkpoint-like directory (the test suite's tiny Llama, valid, padded with files of random
bytes to the size asked for) is registered through the registry services and validated (READY),
and the portal runs as in production (`python -m portal.serve`, one uvicorn worker, the bench's
own database and Redis prefixes) in a child process. Each repetition then times:

* copy (the baseline, what a shared filesystem costs at best): `shutil.copytree` of the
  directory on the same disk, plus `directory_sha256` of the copy;
* fetch_cold: `serving.dataplane.fetch.fetch(source)` with an empty node cache: the signed
  URL's tar streamed through the portal, unpacked with tarfile's data filter, checksummed;
* fetch_warm: the same call again, answered from the node's cache;
* and, to say where fetch_cold's time goes: download (the same signed URL read and thrown
  away) and checksum (`directory_sha256` of the source).

MB/s are 10^6 bytes of the directory's files (not the tar's headers and padding) per second;
`ratio_fetch_to_copy` is fetch_cold's MB/s over copy's (1.0: as fast as a local copy). Copy
and fetch_cold alternate which goes first; figures are medians over the repetitions.

    python -m bench artifacts [--quick] [--size-mib 512] [--files 4] [--reps 5] [--json PATH]

Writes bench/results/artifacts.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env, processes  # noqa: E402

# The portal serves the files (signed URLs to itself); both this process, which signs the URLs,
# and the server child read these settings.
PORT = processes.free_port()
os.environ["ARTIFACT_DELIVERY"] = "portal"
os.environ["PORTAL_INTERNAL_URL"] = f"http://127.0.0.1:{PORT}"
# Own settings, Redis db (10 unless REDIS_URL is set) and key prefixes (portal-bench-artifacts).
env.setup("artifacts", redis_db=10)

from bench.harness import BenchSession  # noqa: E402
from bench.harness.database import database_url  # noqa: E402
from bench.harness.report import environment, print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import median, ratio  # noqa: E402
from serving.dataplane import fetch  # noqa: E402
from serving.engine.checkpoint import directory_sha256  # noqa: E402
from serving.engine.testing import write_tiny_checkpoint  # noqa: E402
from serving.registry import delivery  # noqa: E402
from serving.registry import services as registry  # noqa: E402
from serving.registry.models import ModelVersion, VersionStatus  # noqa: E402
from tenants import services as tenants  # noqa: E402
from tenants.actors import Actor  # noqa: E402

MIB = 1 << 20
READ_CHUNK = 1 << 20


# --- data ----------------------------------------------------------------------------------


def build_checkpoint(directory: Path, size_bytes: int, files: int) -> int:
    """A valid tiny checkpoint (config.json, model.safetensors, tokenizer.json) padded with
    `files` files of random bytes (`padding-<n>.bin`: validation reads only the files it
    knows, the checksum and the tar take them all) up to `size_bytes`; returns the size."""
    write_tiny_checkpoint(directory, seed=0)
    have = sum(p.stat().st_size for p in directory.iterdir())
    left = max(0, size_bytes - have)
    for n in range(files):
        part = left // (files - n)
        with (directory / f"padding-{n}.bin").open("wb") as handle:
            while part > 0:
                chunk = os.urandom(min(16 * MIB, part))
                handle.write(chunk)
                part -= len(chunk)
                left -= len(chunk)
    return sum(p.stat().st_size for p in directory.iterdir())


def register(directory: Path) -> ModelVersion:
    """A READY version whose artifact is `directory`, through the services (as users do)."""
    owner, tenant = tenants.signup(
        email="owner@artifacts.example",
        password="correct-horse-battery-staple-42",
        organisation="Bench Artifacts",
    )
    actor = Actor(user=owner)
    model = registry.model_create(tenant=tenant, actor=actor, name="artifacts")
    version = registry.version_register_path(
        tenant=tenant, actor=actor, model=model, label="v1", path=str(directory)
    )
    # Validation runs on commit (eagerly under the test settings); run it if it did not.
    registry.version_validate(tenant=tenant, version_id=version.pk)
    version.refresh_from_db()
    if version.status != VersionStatus.READY:
        raise SystemExit(f"the version is {version.status}: {version.failure_reason}")
    return version


# --- measuring -----------------------------------------------------------------------------


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = work()
    return time.perf_counter() - started, value


def copy_and_checksum(source: Path, target: Path, sha: str) -> dict[str, float]:
    copy_s, _ = timed(lambda: shutil.copytree(source, target))
    sha_s, copied = timed(lambda: directory_sha256(target))
    if copied != sha:
        raise SystemExit(f"the copy's checksum {copied[:16]}… is not the version's {sha[:16]}…")
    return {"s": copy_s + sha_s, "copy_s": copy_s, "checksum_s": sha_s}


def download(url: str) -> int:
    """The signed URL read to the end and thrown away (as fetch reads it: no proxy)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    received = 0
    with opener.open(url, timeout=fetch.READ_TIMEOUT_S) as response:
        while chunk := response.read(READ_CHUNK):
            received += len(chunk)
    return received


def fetch_cold(source: dict[str, Any], cache: Path) -> dict[str, Any]:
    shutil.rmtree(cache, ignore_errors=True)
    seconds, (path, info) = timed(lambda: fetch.fetch(source))
    if info["cached"] or path != cache / source["sha256"]:
        raise SystemExit(f"the cold fetch was not cold: {info}")
    return {"s": seconds, "bytes": info["bytes"]}


def fetch_warm(source: dict[str, Any]) -> float:
    seconds, (_, info) = timed(lambda: fetch.fetch(source))
    if not info["cached"]:
        raise SystemExit(f"the warm fetch was not served from the cache: {info}")
    return float(seconds)


def mb_per_s(size: int, seconds: float | None) -> float | None:
    return round(size / seconds / 1e6, 1) if seconds else None


# --- report --------------------------------------------------------------------------------


def print_result(result: dict[str, Any]) -> None:
    rows = [
        (name, f"{part['s']:.3f}", f"{part['mb_per_s']:.1f}")
        for name, part in (
            ("copy + checksum", result["copy"]),
            (
                "  copytree",
                {"s": result["copy"]["copy_s"], "mb_per_s": result["copy"]["copy_mb_per_s"]},
            ),
            ("  checksum", result["checksum"]),
            ("download (discarded)", result["download"]),
            ("fetch, cold", result["fetch_cold"]),
        )
    ]
    rows.append(("fetch, warm (cached)", f"{result['fetch_warm']['s']:.5f}", "-"))
    print(
        f"\n  {result['size_bytes'] / MIB:.0f} MiB in {result['files']} files, "
        f"{result['reps']} repetitions (medians)"
    )
    print_table(rows, header=("", "seconds", "MB/s"))
    print(f"\n  fetch_cold / copy (MB/s): {result['ratio_fetch_to_copy']:.3f}x\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="the directory's size")
    parser.add_argument("--files", type=int, default=4, help="padding files of random bytes")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions")
    parser.add_argument("--quick", action="store_true", help="--size-mib 16 --files 2 --reps 2")
    parser.add_argument("--output", type=Path, default=results_path("artifacts"))
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.files, args.reps = 16, 2, 2

    with BenchSession("artifacts") as session:
        test_name = session.database()
        session.redis()
        work = session.workdir()
        cache = work / "node-cache"
        os.environ["PORTAL_ARTIFACT_CACHE_DIR"] = str(cache)  # fetch's cache on this "node"
        directory = work / "checkpoint"
        print(f"writing {args.size_mib} MiB of checkpoint to {directory} ...", flush=True)
        size = build_checkpoint(directory, args.size_mib * MIB, args.files)
        started = time.perf_counter()
        version = register(directory)
        register_s = time.perf_counter() - started

        server_env = {
            **os.environ,
            "DATABASE_URL": database_url(test_name),
            "PYTHONUNBUFFERED": "1",
        }
        print(f"starting the portal on 127.0.0.1:{PORT} ...", flush=True)
        started = time.perf_counter()
        session.process(
            [sys.executable, "-m", "portal.serve", "--host", "127.0.0.1", "--port", str(PORT)],
            server_env,
            work / "portal.log",
            "Uvicorn running on",
        )
        server_start_s = time.perf_counter() - started

        source = delivery.source(version)
        assert source is not None and source["via"] == "portal", source
        tar_bytes = delivery.tar_size(delivery.tar_entries(directory))
        received = download(source["url"])  # warm-up: the server's first request, untimed
        if received != tar_bytes:
            raise SystemExit(f"the portal sent {received} bytes, the tar has {tar_bytes}")

        samples: dict[str, list[float]] = {
            k: [] for k in ("copy", "copy_s", "copy_checksum_s", "cold", "warm", "download", "sha")
        }
        for rep in range(args.reps):
            target = work / "copy"

            def copy(target: Path = target) -> None:
                timing = copy_and_checksum(directory, target, version.sha256)
                samples["copy"].append(timing["s"])
                samples["copy_s"].append(timing["copy_s"])
                samples["copy_checksum_s"].append(timing["checksum_s"])
                shutil.rmtree(target)

            def cold() -> None:
                timing = fetch_cold(source, cache)
                if timing["bytes"] != tar_bytes:
                    raise SystemExit(f"fetch read {timing['bytes']} bytes, the tar has {tar_bytes}")
                samples["cold"].append(timing["s"])
                samples["warm"].append(fetch_warm(source))
                shutil.rmtree(cache)

            for step in (copy, cold) if rep % 2 == 0 else (cold, copy):
                step()
            samples["download"].append(timed(lambda: download(source["url"]))[0])
            samples["sha"].append(timed(lambda: directory_sha256(directory))[0])
            print(
                f"  rep {rep + 1}/{args.reps}: copy {samples['copy'][-1]:.3f} s, "
                f"fetch cold {samples['cold'][-1]:.3f} s, warm {samples['warm'][-1] * 1e3:.2f} ms, "
                f"download {samples['download'][-1]:.3f} s",
                flush=True,
            )

        med = {k: float(median(v) or 0.0) for k, v in samples.items()}
        result = {
            "benchmark": "artifacts",
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "quick": args.quick,
            "size_bytes": size,
            "tar_bytes": tar_bytes,
            "files": len(list(directory.iterdir())),
            "reps": args.reps,
            "register_s": round(register_s, 3),
            "server_start_s": round(server_start_s, 3),
            "copy": {
                "s": round(med["copy"], 4),
                "mb_per_s": mb_per_s(size, med["copy"]),
                "copy_s": round(med["copy_s"], 4),
                "copy_mb_per_s": mb_per_s(size, med["copy_s"]),
                "checksum_s": round(med["copy_checksum_s"], 4),
            },
            "fetch_cold": {"s": round(med["cold"], 4), "mb_per_s": mb_per_s(size, med["cold"])},
            "fetch_warm": {"s": round(med["warm"], 6), "ms": round(med["warm"] * 1e3, 3)},
            "download": {
                "s": round(med["download"], 4),
                "mb_per_s": mb_per_s(size, med["download"]),
            },
            "checksum": {"s": round(med["sha"], 4), "mb_per_s": mb_per_s(size, med["sha"])},
            # fetch_cold MB/s over copy MB/s (the same bytes): copy seconds over fetch seconds
            "ratio_fetch_to_copy": ratio(med["copy"], med["cold"]),
            "samples_s": {k: [round(x, 5) for x in v] for k, v in samples.items()},
            "environment": environment(
                "django", "uvicorn", database=True, redis_url=os.environ["REDIS_URL"]
            ),
        }
        print_result(result)
        write_results("artifacts", result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
