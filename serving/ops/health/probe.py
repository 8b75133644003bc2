"""The health tick's synthetic probe: a one-token completion through the Serve proxy for each
due deployment, and the failed-probe streaks that fire the stable slot's `probe` alert."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from serving.ops.health.targets import SlotResult, Target
from serving.ops.sli_store import Slot
from serving.slo.evaluate import Firing

PROBE_BODY = {"prompt": "health probe", "max_tokens": 1, "temperature": 0}


async def _probe_all(urls: Mapping[int, tuple[str, str]], timeout_s: float) -> dict[int, Any]:
    # aiohttp rather than httpx here: at 1,000 probes a tick httpx's per-request overhead was
    # 4 ms a deployment (bench/health_tick.py), aiohttp's a tenth of that.
    import aiohttp

    results: dict[int, Any] = {}
    limit = asyncio.Semaphore(64)
    connector = aiohttp.TCPConnector(limit=64)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(deployment_id: int, url: str, key: str) -> None:
            status: int | None = None
            async with limit:  # the probe's time starts when its turn comes
                started = time.perf_counter()
                try:
                    async with session.post(
                        url,
                        json=PROBE_BODY,
                        # Pinned to stable: the probe's result is the stable slot's (a canary
                        # has its own SLIs and analysis; a probe landing there would blame
                        # stable for the canary's faults).
                        headers={
                            "authorization": f"Bearer {key}",
                            "x-portal-probe": "1",
                            "x-ab-group": "stable",
                        },
                    ) as response:
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError):
                    status = None
                elapsed = (time.perf_counter() - started) * 1000
            results[deployment_id] = (status is not None and status < 400, elapsed, status)

        await asyncio.gather(*(one(d, url, key) for d, (url, key) in urls.items()))
    return results


def probe(targets: list[Target], serve_url: str, timeout_s: float = 5.0) -> dict[int, Any]:
    """POST a one-token completion through the Serve proxy for each deployment, concurrently;
    (ok, ms, status) per deployment id, status None when no answer came."""
    from serving.deployments.keys import probe_key

    urls = {
        t.deployment.pk: (
            f"{serve_url.rstrip('/')}/{t.deployment.tenant.slug}/{t.deployment.name}"
            "/v1/completions",
            probe_key(t.deployment.pk),
        )
        for t in targets
    }
    return asyncio.run(_probe_all(urls, timeout_s)) if urls else {}


def probe_streaks(
    due: list[Target],
    probes: Mapping[int, Any],
    info: Mapping[int, dict[str, Any]],
    results: dict[Slot, SlotResult],
) -> dict[int, int]:
    """Failed probes in a row per deployment. From HEALTH_PROBE_ALERT_AFTER in a row the stable
    slot fires a `probe` alert (notify; a page from three times that): the contract's SLIs come
    from the replicas, and they never see the requests the proxy holds while Serve replaces a
    crashed or hung replica; the probe, timed from outside, does (issue 6: replica_crash)."""
    after = int(settings.HEALTH_PROBE_ALERT_AFTER)
    streaks: dict[int, int] = {}
    for target in due:
        dep = target.deployment
        ok, ms, status = probes.get(dep.pk, (None, None, None))
        failures = int(info[dep.pk].get("probe_failures", 0))
        failures = 0 if ok else failures + (1 if ok is False else 0)
        streaks[dep.pk] = failures
        result = results.get((dep.pk, "stable"))
        if ok is not False or not after or failures < after or result is None:
            continue
        if result.evaluation is None:  # no contract: nobody asked for incidents
            continue
        answer = f"HTTP {status}" if status else f"no answer within {ms / 1000:.1f} s"
        result.evaluation.firing.append(
            Firing(
                "probe",
                "health-probe",
                "page" if failures >= 3 * after else "ticket",
                "notify",
                f"the health probe failed {failures} time{'s' if failures > 1 else ''} in a row "
                f"({answer})",
                value=float(failures),
            )
        )
    return streaks
