"""python -m bench <scenario> [--quick] [--json PATH] [scenario options...]

Runs one benchmark in this process. --quick: small N and short durations, the same code path
(seconds to about a minute on 2 cores); --json PATH: where the results go (default
bench/results/<scenario>.json). Any other option goes to the scenario (`python -m bench
<scenario> --help`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = {
    "api_list": "the tenant-scoped list endpoint vs a bare DRF view (PostgreSQL, Redis)",
    "artifacts": "a version's files to a node through the portal vs a local copy",
    "detection": "time to the alert of each new signal SLI under its fault (Ray)",
    "drills": "MTTD / MTTR of the chaos drills (Ray, Celery worker + beat)",
    "engine": "the built-in engine vs transformers generate (CPU)",
    "engines": "the built-in engine vs vLLM; the portal before vLLM vs vLLM's own server",
    "gpu_check": "NVML readings of this machine's GPUs (simulated provider without one)",
    "health_tick": "cost per deployment of one health tick vs a naive loop",
    "pages": "each page's render time over 100 deployments and a week of SLI history",
    "prefix": "time to first token with a cached prefix vs cold",
    "priority": "realtime latency under a batch flood, with priority classes vs without",
    "recovery": "a version slot's rollback from its standby copy vs a reload from disk",
    "rollback": "detection and switch time of an automated rollback (Ray, Celery)",
    "router": "latency the router adds over a bare Serve deployment (Ray)",
    "ws_fanout": "the GPU stream fanned out to many WebSocket clients",
}


def usage() -> str:
    lines = [__doc__.strip(), "", "scenarios:"]
    lines += [f"  {name:<12} {what}" for name, what in SCENARIOS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SCENARIOS:
        print(f"unknown scenario {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if "--json" in rest:  # every scenario spells it --output
        rest[rest.index("--json")] = "--output"
    rest = [f"--output={a.removeprefix('--json=')}" if a.startswith("--json=") else a for a in rest]
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    module = importlib.import_module(f"bench.{name}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
