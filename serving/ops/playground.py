"""The deployment playground: one prompt sent to the stable or the canary slot, or to both at
once, through the portal's configured Serve proxy, as the health probe does it (the
deployment's probe key, the slot pinned with `x-ab-group`), bounded for a hostile tenant.

Pinning: the router keeps a valid `x-ab-group` unless the split is sticky *and* the request
carries a client key (serving.dataplane.sticky.requested_group): the playground sends no client
key (no `x-client-key` or configured header, no `user` field), so the header pins on sticky
splits too. A slot whose breaker is open, a canary retired mid-request, or a degraded tier may
still answer from another group; each answer says which group and version replied.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from portal.exceptions import PortalError, ValidationFailed
from serving.dataplane.guard import GuardConfig
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops.health.targets import PROBE_STATUSES
from serving.ops.playground_limits import PlaygroundLimits, playground_limits
from serving.registry.models import ModelVersion

GROUPS = ("stable", "canary")
ARMS = (*GROUPS, "both")
KINDS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
MAX_TEMPERATURE = 2.0
MAX_REPLY_BYTES = 1 << 20  # a reply read past this is cut (a reply is max_tokens long anyway)
MAX_ERROR_CHARS = 500


class PlaygroundUnavailable(PortalError):
    """No Serve proxy is configured for the portal (no cluster)."""

    status_code = 503
    code = "unavailable"


@dataclass(frozen=True)
class ArmAnswer:
    """One slot's reply as the page shows it."""

    asked: str  # the group asked for
    expected_version: str  # the version the revision puts on that slot
    group: str = ""  # x-ab-group of the reply: who answered
    version: str = ""  # x-model-version of the reply
    status: int | None = None
    latency_ms: float = 0.0
    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    request_id: str = ""
    traceparent: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def pinned(self) -> bool:
        """Whether the asked slot answered (not a fallback to the other group or a tier)."""
        return self.group == self.asked


def version_label(version: ModelVersion | None) -> str:
    """The label a slot's replicas report in `x-model-version` (model:version)."""
    return f"{version.model.name}:{version.label}" if version is not None else ""


def playground_arms(*, deployment: Deployment, arm: str) -> tuple[str, ...]:
    """The groups `arm` asks for, or a ValidationFailed on `arm` naming why not."""
    if arm not in ARMS:
        raise ValidationFailed(f"must be one of {', '.join(ARMS)}; got {arm!r}.", field="arm")
    revision = deployment.current_revision
    if deployment.status not in PROBE_STATUSES or revision is None:
        raise ValidationFailed(
            f"{deployment.name} is not serving (status {deployment.get_status_display()}): "
            "nothing can answer.",
            field="arm",
        )
    if arm != "stable" and revision.canary_version_id is None:
        raise ValidationFailed(
            f"{deployment.name} has no canary: pick stable, or set a canary first.", field="arm"
        )
    return GROUPS if arm == "both" else (arm,)


def request_body(*, kind: str, prompt: str, max_tokens: int, temperature: float) -> dict[str, Any]:
    """The OpenAI-shaped body. No `user` field: it would be a client key on a sticky split."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _check(
    *,
    deployment: Deployment,
    kind: str,
    prompt: str,
    max_tokens: int,
    temperature: float,
    limits: PlaygroundLimits,
) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValidationFailed(f"must be one of {', '.join(KINDS)}; got {kind!r}.", field="kind")
    if not prompt.strip():
        raise ValidationFailed("write a prompt.", field="prompt")
    if len(prompt) > limits.max_prompt_chars:
        raise ValidationFailed(
            f"at most {limits.max_prompt_chars} characters here; got {len(prompt)}.",
            field="prompt",
        )
    if not 1 <= max_tokens <= limits.max_tokens:
        raise ValidationFailed(f"must be from 1 to {limits.max_tokens}.", field="max_tokens")
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise ValidationFailed(f"must be from 0 to {MAX_TEMPERATURE:g}.", field="temperature")
    body = request_body(kind=kind, prompt=prompt, max_tokens=max_tokens, temperature=temperature)
    revision = deployment.current_revision
    guard = GuardConfig.from_dict(revision.guard if revision is not None else None)
    size = len(json.dumps(body).encode())
    if size > guard.max_body_bytes:
        raise ValidationFailed(
            f"the request would be {size} bytes; {deployment.name} accepts at most "
            f"{guard.max_body_bytes}.",
            field="prompt",
        )
    return body


def serve_url_configured() -> str:
    """The portal's own Serve proxy (the cluster's configuration); never the tenant's word."""
    from serving.control.cluster import ClusterConfigError, ray_target_from_env

    try:
        return ray_target_from_env().serve_url.rstrip("/")
    except ClusterConfigError as exc:
        raise PlaygroundUnavailable(
            f"No Serve proxy is configured for the portal ({exc})."
        ) from None


def playground_run(
    *,
    deployment: Deployment,
    kind: str,
    prompt: str,
    max_tokens: int,
    temperature: float,
    arm: str,
    limits: PlaygroundLimits | None = None,
) -> list[ArmAnswer]:
    """Send the prompt to the slot(s) `arm` asks for (both at once for "both") and return each
    reply. Bad input is a ValidationFailed naming its field; nothing is stored."""
    limits = limits or playground_limits(deployment=deployment)
    groups = playground_arms(deployment=deployment, arm=arm)
    body = _check(
        deployment=deployment,
        kind=kind,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        limits=limits,
    )
    from serving.deployments.keys import probe_key

    url = f"{serve_url_configured()}/{deployment.tenant.slug}/{deployment.name}{KINDS[kind]}"
    revision = deployment.current_revision
    return asyncio.run(
        _ask_all(
            url,
            probe_key(deployment.pk),
            body,
            [(group, _expected(revision, group)) for group in groups],
            limits.timeout_s,
        )
    )


def _expected(revision: DeploymentRevision | None, group: str) -> str:
    if revision is None:
        return ""
    return version_label(revision.canary_version if group == "canary" else revision.stable_version)


async def _ask_all(
    url: str,
    key: str,
    body: dict[str, Any],
    groups: Sequence[tuple[str, str]],
    timeout_s: float,
) -> list[ArmAnswer]:
    # aiohttp, as the health probe and the consistency probe call the router.
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(
            await asyncio.gather(
                *(
                    _ask(session, url, key, body, group, expected, timeout_s)
                    for group, expected in groups
                )
            )
        )


async def _read_capped(response: Any) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            break
    return b"".join(chunks)[:MAX_REPLY_BYTES]


async def _ask(
    session: Any,
    url: str,
    key: str,
    body: dict[str, Any],
    group: str,
    expected: str,
    timeout_s: float,
) -> ArmAnswer:
    import aiohttp

    headers = {
        "authorization": f"Bearer {key}",
        "x-portal-probe": "playground",
        "x-ab-group": group,
    }
    started = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers) as response:
            raw = await _read_capped(response)
            status, reply_headers = response.status, response.headers
    except TimeoutError:
        return ArmAnswer(
            asked=group,
            expected_version=expected,
            latency_ms=(time.perf_counter() - started) * 1000,
            error=f"no answer within {timeout_s:g} s",
        )
    except aiohttp.ClientError as exc:
        return ArmAnswer(
            asked=group,
            expected_version=expected,
            latency_ms=(time.perf_counter() - started) * 1000,
            error=f"the Serve proxy could not be reached ({type(exc).__name__})",
        )
    latency_ms = (time.perf_counter() - started) * 1000
    return _answer(group, expected, status, reply_headers, raw, latency_ms)


def _answer(
    group: str, expected: str, status: int, headers: Any, raw: bytes, latency_ms: float
) -> ArmAnswer:
    try:
        data = json.loads(raw or b"null")
    except (UnicodeDecodeError, ValueError):
        data = None
    text, reason, error = "", "", ""
    usage: dict[str, Any] = {}
    if status == 200 and isinstance(data, dict):
        try:
            choice = data["choices"][0]
            message = choice.get("message")
            text = str(message.get("content", "") if isinstance(message, dict) else choice["text"])
            reason = str(choice.get("finish_reason") or "")
        except (KeyError, IndexError, TypeError, AttributeError):
            error = "the reply is not an OpenAI completion"
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    else:
        detail = data.get("error") if isinstance(data, dict) else None
        if isinstance(detail, dict):
            error = f"{detail.get('code', 'error')}: {detail.get('message', '')}"
        else:
            error = raw[:MAX_ERROR_CHARS].decode(errors="replace") or "no reply body"
    return ArmAnswer(
        asked=group,
        expected_version=expected,
        group=str(headers.get("x-ab-group", "")),
        version=str(headers.get("x-model-version", "")),
        status=status,
        latency_ms=latency_ms,
        text=text,
        finish_reason=reason,
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        request_id=str(headers.get("x-request-id", "")),
        traceparent=str(headers.get("traceparent", "")),
        error=error[:MAX_ERROR_CHARS],
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
