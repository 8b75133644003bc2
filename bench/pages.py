"""Benchmark: the time to render each of the portal's pages over a tenant with 100 deployments
and a week of SLI history, against the portal's bare shell rendered in the same rounds.

Seeds (bench.fleet, in bulk) one tenant with N running deployments (a canary on every other
one), an SLA contract each, a stored SLI history of `--days` days (one minute row a minute per
slot, plus 15 minutes of 2-second raw rows), an open incident from a burn-rate breach on every
fifth deployment and a rollback on every tenth. Then, signed in as the tenant's owner (staff,
for the platform view), renders every page through `django.test.Client` in interleaved rounds
(each round renders every page once, the shell included, so drift hits all alike):

* shell: a page that extends base.html with no content, behind the same `tenant_page`
  decorator (session, membership, sidebar): what every page pays before its own work;
* each page: its p50 / p95 render time, p95 / the shell's p95, and its SQL query count.

The run uses its own PostgreSQL database (``test_<name>_pages`` of DATABASE_URL) and its own
Redis key prefix (portal-bench-pages); it never touches real data. From the repository root::

    python -m bench pages [--quick] [--deployments 100] [--days 7] [--rounds 20]
    python -m bench pages --profile "compare 7d"   # cProfile of one render, no timings

Results go to stdout and to bench/results/pages.json.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env  # noqa: E402

env.setup("pages", redis_db=12)

from django.db import connection  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.template import engines  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import include, path, reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.fleet import History, seed_deployments, seed_history, seed_tenants  # noqa: E402
from bench.harness import BenchSession  # noqa: E402
from bench.harness.report import environment, print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import percentile, ratio  # noqa: E402
from incidents import services as incident_services  # noqa: E402
from serving.deployments.models import Deployment  # noqa: E402
from serving.ops.models import Rollback, SliSample  # noqa: E402
from tenants.models import Quota, Tenant  # noqa: E402
from tenants.pages import tenant_page  # noqa: E402

RESULTS_PATH = results_path("pages")
BENCH_URLCONF = "bench_pages_urls"
RAW_ROWS = 450  # 15 minutes of 2-second rows: the 15m range reads them


@tenant_page()
def shell(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """base.html with no content, for the signed-in member: the floor of every page."""
    template = engines["django"].from_string('{% extends "base.html" %}')
    return HttpResponse(template.render({}, request))


def install_urlconf() -> str:
    module = types.ModuleType(BENCH_URLCONF)
    module.urlpatterns = [  # type: ignore[attr-defined]
        path("bench/t/<slug:slug>/shell/", shell, name="bench-shell"),
        path("", include("portal.urls")),
    ]
    sys.modules[BENCH_URLCONF] = module
    return BENCH_URLCONF


def seed(n: int, days: int) -> tuple[Any, Tenant, int]:
    """One tenant, N deployments with history, incidents and rollbacks; returns the owner,
    the tenant and the number of stored SLI rows."""
    (seeded,) = seed_tenants(1)
    tenant, owner = seeded.tenant, seeded.owner
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    Quota.objects.filter(tenant=tenant).update(max_deployments=n + 10, max_replicas=4 * n)
    slots = seed_deployments(n, [seeded])
    base = float(int(time.time()) // 2 * 2)
    minutes = days * 1440
    history = History(
        base=base,
        t0=base - base % 60 - 60 * (minutes + 1),
        raw_dense=RAW_ROWS,
        raw_sparse=0,
        minutes=minutes,
        minute_step=1,
    )
    stored = seed_history(slots, history)
    now = timezone.now()
    for i, deployment in enumerate(Deployment.objects.filter(tenant=tenant).order_by("pk")):
        if i % 5 == 0:
            incident_services.breach_record(
                tenant=tenant, deployment=deployment, group="stable", objective="availability",
                severity="page", detected_at=now - timedelta(minutes=5 + i), kind="burn",
                action="rollback", detail="burn rate 14.4x over 1h/5m",
                observed={"error_ratio": 0.2}, burn_long=15.0, burn_short=20.0,
                contract_version=1,
            )  # fmt: skip
        if i % 10 == 0:
            revision = deployment.current_revision
            Rollback.objects.create(
                tenant=tenant, deployment=deployment, key=f"bench-{i}", trigger="manual",
                from_revision=revision, to_revision=revision, detected_at=now,
            )  # fmt: skip
    return owner, tenant, stored


def page_urls(tenant: Tenant) -> dict[str, str]:
    slug = tenant.slug
    deployment = Deployment.objects.filter(tenant=tenant).order_by("pk").first()
    assert deployment is not None
    d = {"slug": slug, "pk": deployment.pk}
    model = deployment.current_revision.stable_version.model
    series = reverse("serving-deployment-health-series", kwargs=d)
    return {
        "shell": reverse("bench-shell", args=[slug]),
        "home": reverse("tenant-overview", args=[slug]),
        "home (live part)": reverse("tenant-overview-live", args=[slug]),
        "deployments": reverse("serving-deployments", args=[slug]),
        "deployment": reverse("serving-deployment", kwargs=d),
        "health": reverse("serving-deployment-health", kwargs=d),
        "health (live part)": reverse("serving-deployment-health-live", kwargs=d),
        "health series 24h": f"{series}?range=24h",
        "health series 7d": f"{series}?range=7d",
        "contract": reverse("serving-deployment-contract", kwargs=d),
        "rollouts": reverse("serving-deployment-rollouts", kwargs=d),
        "requests": reverse("serving-deployment-requests", kwargs=d),
        "compare 24h": reverse("serving-deployment-compare", kwargs=d) + "?range=24h",
        "compare 7d": reverse("serving-deployment-compare", kwargs=d) + "?range=7d",
        "breaker": reverse("serving-deployment-breaker", kwargs=d),
        "playground": reverse("serving-deployment-playground", kwargs=d),
        "models": reverse("serving-models", args=[slug]),
        "model": reverse("serving-model", kwargs={"slug": slug, "pk": model.pk}),
        "gpus": reverse("serving-gpus", args=[slug]),
        "pools": reverse("serving-pools", args=[slug]),
        "alerts": reverse("alerts", args=[slug]),
        "incidents": reverse("incident-list", args=[slug]),
        "analytics": reverse("incident-analytics-page", args=[slug]),
        "drills": reverse("drills", args=[slug]),
        "notifications": reverse("notification-channels", args=[slug]),
        "cause rules": reverse("cause-rules", args=[slug]),
        "audit": reverse("tenant-audit", args=[slug]),
        "platform": reverse("platform-status"),
    }


def measure(client: Client, urls: dict[str, str], rounds: int, warmup: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {name: [] for name in urls}
    queries: dict[str, int] = {}
    for name, url in urls.items():  # warm caches, count queries once
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"{name} ({url}) answered {response.status_code}")
        queries[name] = len(captured)
    for round_no in range(warmup + rounds):
        for name, url in urls.items():
            started = time.perf_counter()
            response = client.get(url)
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, (name, response.status_code)
            if round_no >= warmup:
                times[name].append(elapsed * 1000)
    shell_p95 = percentile(times["shell"], 0.95)
    return {
        name: {
            "p50_ms": round(percentile(values, 0.5), 2),
            "p95_ms": round(percentile(values, 0.95), 2),
            "vs_shell_p95": ratio(percentile(values, 0.95), shell_p95),
            "queries": queries[name],
        }
        for name, values in times.items()
    }


def profile(client: Client, urls: dict[str, str], page: str) -> None:
    """cProfile of one render of `page` (after one warm-up), the top 40 by cumulative time."""
    client.get(urls[page])
    profiler = cProfile.Profile()
    profiler.enable()
    client.get(urls[page])
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pages", description=__doc__)
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--days", type=int, default=7, help="days of minute rows per slot")
    parser.add_argument("--rounds", type=int, default=20, help="timed renders of each page")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="10 deployments, 1 day, 5 rounds")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    parser.add_argument("--profile", metavar="PAGE", help="profile one page's render instead")
    args = parser.parse_args(argv)
    if args.quick:
        args.deployments, args.days, args.rounds, args.warmup = 10, 1, 5, 1
    with BenchSession("pages") as session, override_settings(ROOT_URLCONF=install_urlconf()):
        session.database()
        session.redis()
        started = time.perf_counter()
        owner, tenant, stored = seed(args.deployments, args.days)
        seed_s = round(time.perf_counter() - started, 1)
        print(f"{args.deployments} deployments, {stored:,} SLI rows, seeded in {seed_s} s")
        client = Client()
        client.force_login(owner)
        if args.profile:
            profile(client, page_urls(tenant), args.profile)
            return 0
        pages = measure(client, page_urls(tenant), args.rounds, args.warmup)
        rows = [
            [name, f["p50_ms"], f["p95_ms"], f"{f['vs_shell_p95']}x", f["queries"]]
            for name, f in pages.items()
        ]
        print_table(rows, header=["page", "p50 ms", "p95 ms", "p95 / shell", "queries"])
        worst = max((n for n in pages if n != "shell"), key=lambda n: pages[n]["p95_ms"])
        print(f"\nslowest page: {worst}, p95 {pages[worst]['p95_ms']} ms")
        results = {
            "benchmark": "pages",
            "environment": environment(database=True),
            "deployments": args.deployments,
            "days": args.days,
            "rounds": args.rounds,
            "sli_rows": SliSample.objects.count(),
            "seed_s": seed_s,
            "pages": pages,
            "slowest": {"page": worst, **pages[worst]},
        }
        write_results("pages", results, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
