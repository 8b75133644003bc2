"""Benchmark: the tenant-scoped audit-event list endpoint against a bare DRF ListAPIView.

Both views list the same AuditEvent table with the same serializer and the same cursor
pagination, in this process, through `django.test.Client`:

* scoped: ``GET /api/v1/audit-events/`` with a Bearer token (token authentication, tenant
  resolution, scope check, the Redis rate limiter, the filterset, the tenant filter);
* bare: a plain ``ListAPIView`` over ``AuditEvent.objects.all().order_by("-id")`` with no
  authentication and no permissions, mounted on a URL for this run only.

The run uses its own PostgreSQL database, created and dropped through Django's test-database
machinery (``test_<name>`` of DATABASE_URL), and its own Redis key prefixes; it never touches
real data. Run from the repository root::

    python -m bench api_list [--quick] [--iterations 300] [--profile 200] [--json PATH]

Results go to stdout and to bench/results/api_list.json.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env  # noqa: E402

# Own settings, Redis db (12 unless REDIS_URL is set) and key prefixes (portal-bench-api-list).
env.setup("api_list", redis_db=12)

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import include, path  # noqa: E402
from django.utils import timezone  # noqa: E402
from rest_framework.generics import ListAPIView  # noqa: E402

from bench.harness import BenchSession  # noqa: E402
from bench.harness.profiling import top  # noqa: E402
from bench.harness.report import environment, print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import ratio, summarise  # noqa: E402
from portal import ratelimit  # noqa: E402
from portal.api.pagination import IdCursorPagination  # noqa: E402
from tenants import services  # noqa: E402
from tenants.actors import Actor  # noqa: E402
from tenants.api.serializers import AuditEventSerializer  # noqa: E402
from tenants.models import AuditEvent, Quota, Scope, Tenant  # noqa: E402

SCOPED_URL = "/api/v1/audit-events/"
BARE_URL = "/bench/bare-audit-events/"
BENCH_URLCONF = "bench_api_list_urls"
TARGET_RATIO = 0.8
# High enough that the limiter never throttles; the limiter itself stays on (Redis script).
BENCH_RPS = 1_000_000
RESULTS_PATH = results_path("api_list")
ACTIONS = (
    "deployment.created",
    "deployment.scaled",
    "deployment.deleted",
    "api_token.created",
    "membership.role_changed",
    "quota.updated",
)


class BareAuditEventList(ListAPIView):  # type: ignore[type-arg]
    """The baseline: the same table, serializer and pagination; no auth, no permissions."""

    queryset = AuditEvent.objects.all().order_by("-id")
    serializer_class = AuditEventSerializer
    pagination_class = IdCursorPagination
    authentication_classes: list[type] = []
    permission_classes: list[type] = []


def install_bench_urlconf() -> str:
    """A urlconf module (in sys.modules only) with the bare view in front of portal.urls."""
    module = types.ModuleType(BENCH_URLCONF)
    module.urlpatterns = [  # type: ignore[attr-defined]
        path(BARE_URL.strip("/") + "/", BareAuditEventList.as_view(), name="bench-bare-audit"),
        path("", include("portal.urls")),
    ]
    sys.modules[BENCH_URLCONF] = module
    return BENCH_URLCONF


# --- data ----------------------------------------------------------------------------------


def seed(n_tenants: int, n_events: int) -> tuple[Tenant, str]:
    """Tenants through signup, quotas raised, one read token, then audit rows in bulk.

    The audit rows are dealt round-robin over the tenants, so each tenant's rows are spread
    over the whole id range (the scoped query must use the (tenant, -id) index, not luck).
    The table ends up holding exactly `n_events` rows, signup's own audit rows included.
    """
    owners_and_tenants = [
        services.signup(
            email=f"owner{i:02d}@bench{i:02d}.example",
            password="correct-horse-battery-staple-42",
            organisation=f"Bench Org {i:02d}",
        )
        for i in range(n_tenants)
    ]
    tenants = [tenant for _, tenant in owners_and_tenants]
    updated = Quota.objects.filter(tenant__in=tenants).update(requests_per_second=BENCH_RPS)
    assert updated == n_tenants, f"expected {n_tenants} quota rows, updated {updated}"

    owner, tenant = owners_and_tenants[0]
    _, raw_token = services.api_token_create(
        tenant=tenant, actor=Actor(user=owner), name="bench", scopes=[Scope.READ]
    )

    start = AuditEvent.objects.count()
    now = timezone.now()
    rows = []
    for i in range(start, n_events):
        row_owner, row_tenant = owners_and_tenants[i % n_tenants]
        replicas = i % 8
        rows.append(
            AuditEvent(
                tenant=row_tenant,
                actor=row_owner,
                actor_label=row_owner.email,
                action=ACTIONS[i % len(ACTIONS)],
                object_type="serving.deployment",
                object_id=str(i),
                object_repr=f"llama-3-8b-{i}",
                before={"replicas": replicas, "model": "llama-3-8b", "gpus": 1},
                after={"replicas": replicas + 1, "model": "llama-3-8b", "gpus": 1},
                created_at=now - timedelta(seconds=n_events - i),
            )
        )
    AuditEvent.objects.bulk_create(rows, batch_size=2000)
    assert AuditEvent.objects.count() == n_events
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {AuditEvent._meta.db_table}")
    return tenant, raw_token


# --- measuring -----------------------------------------------------------------------------


def get_ok(client: Client, url: str) -> Any:
    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} -> {response.status_code}: {response.content[:300]!r}")
    return response


def check_pages(scoped: Client, bare: Client, tenant: Tenant) -> dict[str, int]:
    """Both views return full pages of the right rows before anything is timed."""
    page_size = settings.REST_FRAMEWORK["PAGE_SIZE"]
    scoped_ids = [row["id"] for row in get_ok(scoped, SCOPED_URL).json()["results"]]
    expected = list(
        AuditEvent.objects.filter(tenant=tenant)
        .order_by("-id")
        .values_list("id", flat=True)[:page_size]
    )
    assert scoped_ids == expected, "scoped page 1 is not the tenant's newest rows"
    bare_ids = [row["id"] for row in get_ok(bare, BARE_URL).json()["results"]]
    expected = list(AuditEvent.objects.order_by("-id").values_list("id", flat=True)[:page_size])
    assert bare_ids == expected, "bare page 1 is not the table's newest rows"
    return {"page_size": page_size, "rows_per_page": len(scoped_ids)}


def count_queries(client: Client, url: str, last_page: int = 3) -> dict[str, Any]:
    """SQL queries of each page 1..last_page, following the `next` cursor link."""
    pages: dict[str, Any] = {}
    for page in range(1, last_page + 1):
        with CaptureQueriesContext(connection) as ctx:
            body = get_ok(client, url).json()
        pages[str(page)] = {
            "queries": len(ctx.captured_queries),
            "sql": [q["sql"] for q in ctx.captured_queries],
        }
        url = body["next"]
        assert url, f"no page after page {page}"
    counts = {page: info["queries"] for page, info in pages.items()}
    return {"pages": pages, "constant": len(set(counts.values())) == 1}


def timed(client: Client, url: str) -> float:
    started = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} -> {response.status_code} during the timed run")
    return elapsed


def run_ab(scoped: Client, bare: Client, iterations: int) -> tuple[list[float], list[float]]:
    """Interleaved A/B/A/B..., so drift (CPU frequency, neighbours, cache TTLs) hits both."""
    scoped_times: list[float] = []
    bare_times: list[float] = []
    gc.collect()
    for _ in range(iterations):
        scoped_times.append(timed(scoped, SCOPED_URL))
        bare_times.append(timed(bare, BARE_URL))
    return scoped_times, bare_times


def profile(client: Client, url: str, n: int, out: Path) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        client.get(url)
    profiler.disable()
    profiler.dump_stats(out)
    return "\n".join(
        f"--- {url} x{n}, by {sort} ---\n{top(profiler, sort)}"
        for sort in ("tottime", "cumulative")
    )


# --- report --------------------------------------------------------------------------------


def print_result(result: dict[str, Any]) -> None:
    s, b = result["scoped"], result["bare"]
    rows = [
        ("", "scoped", "bare"),
        ("requests", str(s["timing"]["requests"]), str(b["timing"]["requests"])),
        ("req/s", f"{s['timing']['req_per_s']:.1f}", f"{b['timing']['req_per_s']:.1f}"),
        ("mean ms", f"{s['timing']['mean_ms']:.3f}", f"{b['timing']['mean_ms']:.3f}"),
        ("p50 ms", f"{s['timing']['p50_ms']:.3f}", f"{b['timing']['p50_ms']:.3f}"),
        ("p95 ms", f"{s['timing']['p95_ms']:.3f}", f"{b['timing']['p95_ms']:.3f}"),
    ]
    rows.extend(
        (
            f"SQL/request page {page}",
            str(s["queries"]["pages"][page]["queries"]),
            str(b["queries"]["pages"][page]["queries"]),
        )
        for page in s["queries"]["pages"]
    )
    rows.append(
        ("SQL constant", str(s["queries"]["constant"]), str(b["queries"]["constant"])),
    )
    print(f"\n  rate limiter: {result['config']['rate_limiter']}")
    print_table(rows)
    verdict = "OK" if result["ratio_ok"] else "BELOW TARGET"
    print(
        f"\n  ratio scoped/bare: {result['ratio']:.3f}x  (target >= {TARGET_RATIO}x: {verdict})\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300, help="timed requests per view")
    parser.add_argument("--warmup", type=int, default=30, help="untimed requests per view")
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--events", type=int, default=10_000, help="AuditEvent rows in all")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the run, cProfile N requests of each view and print the top functions",
    )
    parser.add_argument(
        "--strict-limiter",
        action="store_true",
        help="no rate-limit leases: one Redis round trip per request, as for default quotas",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--iterations 40 --warmup 5 --tenants 4 --events 1000",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.warmup, args.tenants, args.events = 40, 5, 4, 1000

    # DEBUG off as in production (no per-query logging); CaptureQueriesContext still works.
    with BenchSession("api_list") as session:
        test_name = session.database()
        session.redis()
        print(f"test database {test_name}: seeding {args.tenants} tenants, {args.events} events")
        started = time.perf_counter()
        tenant, raw_token = seed(args.tenants, args.events)
        seed_s = time.perf_counter() - started

        headers = {"accept": "application/json", "authorization": f"Bearer {raw_token}"}
        scoped = Client(headers=headers)
        bare = Client(headers=headers)  # the header is ignored there: no authentication
        limiter = {"RATE_LIMIT_LEASE_MAX": 1} if args.strict_limiter else {}
        with override_settings(ROOT_URLCONF=install_bench_urlconf(), **limiter):
            lease = ratelimit.lease_size([ratelimit.Bucket("bench", BENCH_RPS)])
            shape = check_pages(scoped, bare, tenant)
            for _ in range(args.warmup):
                get_ok(scoped, SCOPED_URL)
                get_ok(bare, BARE_URL)
            queries = {
                "scoped": count_queries(scoped, SCOPED_URL),
                "bare": count_queries(bare, BARE_URL),
            }
            print(f"timing {args.iterations} requests per view, interleaved A/B ...")
            scoped_times, bare_times = run_ab(scoped, bare, args.iterations)
            profiles = {}
            if args.profile:
                args.output.parent.mkdir(parents=True, exist_ok=True)
                for name, client, url in (("scoped", scoped, SCOPED_URL), ("bare", bare, BARE_URL)):
                    out = args.output.parent / f"api_list.{name}.prof"
                    profiles[name] = str(out)
                    print(profile(client, url, args.profile, out))

        scoped_timing, bare_timing = summarise(scoped_times), summarise(bare_times)
        scoped_to_bare = ratio(scoped_timing["req_per_s"], bare_timing["req_per_s"])
        result = {
            "benchmark": "api_list",
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "config": {
                "quick": args.quick,
                "iterations": args.iterations,
                "warmup": args.warmup,
                "tenants": args.tenants,
                "events": args.events,
                "events_per_tenant": AuditEvent.objects.filter(tenant=tenant).count(),
                "quota_requests_per_second": BENCH_RPS,
                "rate_limiter": (
                    "on (Redis token bucket, one round trip per request)"
                    if lease == 1
                    else f"on (Redis token bucket, leases of {lease} tokens per round trip)"
                ),
                "seed_s": round(seed_s, 2),
                **shape,
            },
            "environment": environment(
                "django", "djangorestframework", database=True, redis_url=settings.REDIS_URL
            ),
            "scoped": {
                "url": SCOPED_URL,
                "timing": scoped_timing,
                "queries": queries["scoped"],
            },
            "bare": {"url": BARE_URL, "timing": bare_timing, "queries": queries["bare"]},
            "ratio": scoped_to_bare,
            "target_ratio": TARGET_RATIO,
            "ratio_ok": scoped_to_bare >= TARGET_RATIO,
            "profiles": profiles,
        }
        print_result(result)
        write_results("api_list", result, args.output)
        if not result["ratio_ok"] and not args.profile:
            print("below target: rerun with --profile 200 to see where the scoped view spends it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
