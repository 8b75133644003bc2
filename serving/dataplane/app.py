"""The Ray Serve applications the portal deploys (see serving.control.compile):

* a router application per portal deployment (ingress on `route_prefix`): checks the tenant's
  inference key, guards the input, splits traffic stable/canary, keeps `X-AB-Group` and
  `traceparent`, trips a circuit breaker per version, answers OpenAI-style;
* a version application per slot (`stable`, `canary`) running the engine; which weights it
  serves is user_config, so a new version of the same architecture is hot-reloaded beside the
  old weights and swapped without restarting the replica.

Everything the portal changes at run time (weights, keys, traffic split, faults, quotas) is
user_config: Serve calls `reconfigure()` on live replicas.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import os
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from serving.dataplane import openai
from serving.dataplane.breaker import BreakerConfig, CircuitBreaker
from serving.dataplane.faults import FaultInjector, InjectedFault
from serving.dataplane.guard import GuardConfig, Refused, check_lengths, parse_body
from serving.dataplane.keys import bearer, hash_key, key_matches
from serving.dataplane.lifecycle import (
    COMPLETED,
    EXECUTING,
    FAILED,
    ROUTING,
    VALIDATING,
    Lifecycle,
    RecentRequests,
)
from serving.dataplane.sli import SliRecorder, publish
from serving.dataplane.traffic import choose_group, continue_trace

logger = logging.getLogger("ray.serve")
LOCAL_SERVER = "serving.dataplane.app:VersionCore"
MAX_REQUEST_ID = 128  # longer client ids are replaced by one of ours
_E = TypeVar("_E", bound=BaseException)


def _replica_id() -> str:
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (unit tests)
        return f"pid-{os.getpid()}"


def _app_name() -> str:
    try:
        return str(serve.get_replica_context().app_name)
    except Exception:  # outside a replica (unit tests)
        return ""


class _Publisher:
    """Publishes a replica's snapshot (SLI window, or the router's breakers and recent
    request lifecycles) to Redis once a second."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        write: Callable[[Any, str, dict[str, Any]], Awaitable[None]],
    ) -> None:
        self.snapshot = snapshot
        self.write = write
        self.redis_url: str | None = None
        self.prefix = "portal"
        self._redis: Any = None
        self._task: asyncio.Task[None] | None = None

    def configure(self, telemetry: dict[str, Any]) -> None:
        url = telemetry.get("redis_url") or None
        if url != self.redis_url:
            self.redis_url, self._redis = url, None
        self.prefix = telemetry.get("prefix", "portal")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            snapshot = self.snapshot()
            if not self.redis_url:
                continue
            try:
                if self._redis is None:
                    import redis.asyncio as aioredis

                    self._redis = aioredis.Redis.from_url(self.redis_url)
                await self.write(self._redis, self.prefix, snapshot)
            except Exception as exc:  # telemetry must never take inference down
                logger.warning("telemetry publish failed: %s", exc)
                self._redis = None


class VersionCore:
    """One version slot's engine: weights (hot-reloaded from user_config), tenants' cache salts
    and quotas, faults, SLI window. Runs as its own Serve deployment (`VersionServer`: a
    canary, a shared pool) or inside the router's replica for the stable slot."""

    def __init__(self, app: str, group: str, engine: dict[str, Any], arch_key: str = "") -> None:
        self.app, self.group = app, group
        self.engine_options = engine
        self.arch_key = arch_key  # changes only with the architecture: forces new replicas
        self.engine: Any = None
        self.tokenizer: Any = None
        self.loaded: dict[str, Any] = {}
        self.tenants: dict[str, dict[str, Any]] = {}
        self.faults: dict[str, Any] = {}
        self.reloads: list[dict[str, Any]] = []
        self.recorder = SliRecorder(app, group, "", _replica_id())
        # Started now: a drill's crash/hang faults spare replicas started after it was issued.
        self.chaos = FaultInjector(self.recorder.replica, started_at=time.time())
        self.publisher = _Publisher(self._published, publish)
        self._load_lock = asyncio.Lock()
        self._reload_key: tuple[Any, ...] | None = None  # weight_swap_jitter's, last seen
        self._probe_identities: set[str] = set()  # kv_pollution_probe tenants seen here
        self._departed: set[str] = set()  # tenants taken off this version, blocks to give back

    def _published(self) -> dict[str, Any]:
        """Once a second: the SLI window for Redis, after giving back what a departed probe
        identity left in the KV cache (a fault that expired ends without a reconfigure)."""
        self._forget_departed_probes()
        return self.recorder.roll(kv=self._kv_stats())

    def _kv_stats(self) -> dict[str, Any]:
        metrics = self.engine.metrics() if self.engine is not None else {}
        forced = [r for r in self.reloads if r.get("nonce") is not None]
        keys = ("drill", "nonce", "ok", "s", "at")
        reload = {k: forced[-1].get(k) for k in keys} if forced else None
        return {**metrics, "fault_leaked_mb": round(self.chaos.leaked_mb, 1),
                "fault_reload": reload}  # fmt: skip

    async def reconfigure(self, config: dict[str, Any]) -> None:
        self.faults = dict(config.get("faults") or {})
        self.chaos.configure(self.faults)
        tenants = {
            str(t): {
                "salt": bytes.fromhex(v["salt"]),
                "quota_blocks": v.get("quota_blocks"),
                "max_running": v.get("max_running"),
            }
            for t, v in (config.get("tenants") or {}).items()
        }
        # A tenant taken off this version (its pool access revoked, suspended) leaves nothing
        # behind: its cached blocks go back to the free list once its last requests end.
        self._departed |= set(self.tenants) - set(tenants)
        self._departed -= set(tenants)
        self.tenants = tenants
        self.publisher.configure(config.get("telemetry") or {})
        artifact = config.get("artifact")
        # A weight_swap_jitter drill's new nonce reloads the same artifact (a hot reload).
        reload_key = self.chaos.reload_key()
        forced = reload_key is not None and reload_key != self._reload_key
        if artifact and (artifact != self.loaded.get("artifact") or forced):
            async with self._load_lock:
                await self._load(config, forced=reload_key if forced else None)
        self._reload_key = reload_key
        if self.engine is not None:
            quotas = {t: v["quota_blocks"] for t, v in self.tenants.items() if v["quota_blocks"]}
            probe = self.chaos.active().kv_pollution_probe
            if probe is not None:
                self._probe_identities.add(probe.identity)
                quotas[probe.identity] = probe.quota_blocks
            shared = config.get("kv_mode") == "shared"
            self.engine.set_quotas(quotas, 0 if shared else None)
            if shared:  # each pool tenant runs at most its share of the batch at once
                limits = {t: int(v["max_running"]) for t, v in self.tenants.items()
                          if v["max_running"]}  # fmt: skip
                self.engine.set_limits(limits, 1)
            else:
                self.engine.set_limits({}, None)
        self._forget_departed_probes()

    def _forget_departed_probes(self) -> None:
        """A probe identity whose fault is gone (reverted or expired) leaves nothing behind:
        its cached blocks go back to the free list and its counters are dropped. In a tenant
        quota pool only the owner recycles its cached blocks, so they would stay held for
        good. Blocks its last requests still hold are given back on a later pass."""
        if self.engine is None:
            return
        for tenant in sorted(self._departed):
            self.engine.drop_tenant(tenant)  # its requests still here end now, refused
            if _forget_tenant(self.engine, tenant):
                self._departed.discard(tenant)
        if not self._probe_identities:
            return
        probe = self.chaos.active().kv_pollution_probe
        current = probe.identity if probe is not None else None
        for identity in sorted(self._probe_identities - {current}):
            if _forget_tenant(self.engine, identity):
                self._probe_identities.discard(identity)

    async def _load(self, config: dict[str, Any], forced: tuple[Any, ...] | None = None) -> None:
        """Load and validate the new weights beside the old ones, then swap atomically.
        `forced`: a drill's reload of the same artifact (weight_swap_jitter's reload key)."""
        started = time.time()
        drill = {"drill": forced[0], "nonce": forced[2]} if forced else {}
        try:
            model, tokenizer = await asyncio.to_thread(self._build_model, config)
        except Exception as exc:
            self.reloads.append({"artifact": config["artifact"], "ok": False, "error": str(exc),
                                 "at": started, **drill})  # fmt: skip
            if len(self.reloads) > 100:
                del self.reloads[:-50]
            if self.engine is None:
                raise  # nothing to fall back on: the replica cannot serve
            logger.error("hot reload of %s failed, old weights keep serving: %s",
                         config["artifact"], exc)  # fmt: skip
            return
        if self.engine is None:
            from serving.engine.async_engine import AsyncEngine
            from serving.engine.engine import Engine

            opts = self.engine_options
            self.engine = AsyncEngine(
                Engine(
                    model,
                    num_blocks=int(opts.get("num_blocks", 256)),
                    block_size=int(opts.get("block_size", 16)),
                    max_num_seqs=int(opts.get("max_num_seqs", 32)),
                )
            )
        else:
            self.engine.swap_model(model)
        self.tokenizer = tokenizer
        self.loaded = {
            "artifact": config["artifact"],
            "version": config.get("version", ""),
            "fingerprint": model.fingerprint,
        }
        self.recorder.version = str(config.get("version", ""))
        self.reloads.append({"artifact": config["artifact"], "ok": True, "at": started,
                             "s": round(time.time() - started, 4), **drill})  # fmt: skip
        if len(self.reloads) > 100:  # a drill reloads many times: keep the recent history
            del self.reloads[:-50]

    def _build_model(self, config: dict[str, Any]) -> tuple[Any, Any]:
        import torch

        from serving.engine.checkpoint import load_tensors, load_tokenizer
        from serving.engine.config import read_config
        from serving.engine.model import LlamaModel

        directory = Path(config["artifact"])
        model_config = read_config(directory)
        device = "cuda" if self.engine_options.get("gpu") and torch.cuda.is_available() else "cpu"
        fingerprint = config.get("fingerprint") or config["artifact"]
        model = LlamaModel(
            model_config, load_tensors(directory, model_config), device=device,
            fingerprint=fingerprint,
        )  # fmt: skip
        tokenizer = load_tokenizer(directory)
        logits = model.reference_logits(torch.tensor(tokenizer.encode("ready?").ids or [0]))
        if not torch.isfinite(logits).all():
            raise ValueError("test forward pass of the new weights gave non-finite logits")
        return model, tokenizer

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        from serving.engine.engine import SamplingParams

        if self.engine is None:
            raise Refused(503, "not_ready", "this version has no weights loaded yet")
        started = time.time()
        tenant = str(request["tenant"])
        salt = self.tenants.get(tenant, {}).get("salt")
        if salt is None:  # a kv_pollution_probe drill's synthetic tenant, while it is in
            salts = {t: v["salt"] for t, v in self.tenants.items()}
            probe = self.chaos.probe_tenant(tenant, salts)
            salt = probe[0] if probe is not None else None
        if salt is None:
            raise Refused(403, "tenant_not_allowed", "this tenant may not use this version")
        prompt_ids = self.tokenizer.encode(request["prompt"]).ids
        sampling = request["sampling"]
        guard = GuardConfig.from_dict(request.get("guard"))
        ok, first_at, times, out_ids = False, None, [], []
        refused: Refused | None = None
        cancelled = False
        stream: Any = None
        try:
            check_lengths(len(prompt_ids), sampling["max_tokens"], guard)
            self._check_admissible(len(prompt_ids), sampling["max_tokens"], tenant)
            await self._inject_faults()
            params = SamplingParams(
                max_tokens=sampling["max_tokens"],
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                seed=sampling.get("seed"),
            )
            # Queued before the first event, so a refusal (a request id this tenant already
            # runs, a quota changed meanwhile) is the answer's status, not a broken stream.
            stream = self._submit(prompt_ids, params, tenant, str(request["request_id"]), salt)
            yield {
                "type": "start",
                "prompt_tokens": len(prompt_ids),
                "version": self.loaded.get("version"),
                "fingerprint": self.loaded.get("fingerprint"),
                "pid": os.getpid(),
            }
            text = ""
            reason = None
            async for event in stream:
                out_ids.append(event.token_id)
                times.append(event.at)
                first_at = first_at or event.at
                full = self.tokenizer.decode(out_ids)
                if not full.endswith("\ufffd") or event.finished:
                    delta, text = full[len(text) :], full
                    if delta:
                        yield {"type": "token", "text": delta}
                reason = event.finish_reason
            ok = True
            yield {
                "type": "end",
                "finish_reason": reason,
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": len(out_ids),
                    "total_tokens": len(prompt_ids) + len(out_ids),
                },
            }
        except Refused as exc:
            refused = exc
            raise
        except (GeneratorExit, asyncio.CancelledError):
            cancelled = True  # the client went away: not the version's failure
            raise
        except Exception as exc:
            from serving.engine.async_engine import TenantRemoved

            if not isinstance(exc, TenantRemoved):
                raise
            refused = Refused(403, "tenant_not_allowed", "this tenant may not use this version")
            raise refused from exc
        finally:
            if stream is not None:
                stream.close()  # forgets it and frees its blocks, however the request ended
            # Every request counts once: a refusal (4xx: the client's; 5xx: ours), a failure
            # before or after the first token, a cancellation, or a completion.
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
            self.recorder.current.record(
                latency_s=time.time() - started,
                ok=ok,
                client_error=cancelled or (refused is not None and refused.status < 500),
                ttft_s=(first_at - started) if first_at else None,
                itl_s=gaps,
                tokens_in=len(prompt_ids),
                tokens_out=len(out_ids),
            )

    def _check_admissible(self, prompt_tokens: int, max_tokens: int, tenant: str) -> None:
        try:
            self.engine.check_admissible(prompt_tokens, max_tokens, tenant)
        except Exception as exc:
            refusal = _engine_refusal(exc)
            if refusal is None:
                raise
            raise refusal from exc

    def _submit(
        self, prompt_ids: list[int], params: Any, tenant: str, request_id: str, salt: bytes
    ) -> Any:
        try:
            return self.engine.submit(
                prompt_ids, params, tenant=tenant, request_id=request_id, cache_salt=salt
            )
        except Exception as exc:
            refusal = _engine_refusal(exc)
            if refusal is None:
                raise
            raise refusal from exc

    async def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """The whole answer in one reply: a unary handle call costs far less than a stream."""
        text, start, end = "", {}, {}
        async for event in self.generate(request):
            if event["type"] == "token":
                text += event["text"]
            elif event["type"] == "start":
                start = event
            else:
                end = event
        return {**end, "text": text, "version": start.get("version"), "pid": start.get("pid")}

    async def _inject_faults(self) -> None:
        """Per-request faults a chaos drill switched on through user_config (delays, then
        failures: see serving.dataplane.faults)."""
        await self.chaos.before_request()

    def check_health(self) -> None:
        """Serve's periodic health check: fails while a `replica_hang` fault selects this
        replica, so Serve replaces it."""
        self.chaos.check_health()

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "replica": self.recorder.replica,
            "loaded": self.loaded,
            "reloads": self.reloads[-10:],
            "kv": self._kv_stats(),
            "last_window": self.recorder.last,
            "faults": self.chaos.snapshot(),
        }


@serve.deployment(name="version")
class VersionServer(VersionCore):
    """A version slot as its own Serve deployment, reached through a deployment handle."""


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@serve.deployment(name="router")
class Router:
    """The ingress of one portal deployment. A dedicated deployment's stable slot runs inside
    this replica (`local`): stable requests cost no extra actor hop; the canary (and a
    shared pool) is reached through a deployment handle."""

    def __init__(self, local: dict[str, Any] | None = None) -> None:
        self.local: VersionCore | None = None
        if local:
            core = _import(str(local.get("server") or LOCAL_SERVER))
            self.local = core(
                app=str(local["app"]),
                group="stable",
                engine=dict(local.get("engine") or {}),
                arch_key=str(local.get("arch_key", "")),
            )
        self.config: dict[str, Any] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.handles: dict[str, Any] = {}
        self.breakers: dict[str, CircuitBreaker] = {}
        self.recent = RecentRequests()
        self.replica = _replica_id()
        self.publisher = _Publisher(self.stats, _publish_router)
        # A shared deployment's share of the pool's request slots: at most this many of the
        # tenant's requests are in the pool at once, the rest wait here, in its own router.
        self._pool_gate: asyncio.Semaphore | None = None
        self._pool_slots = 0

    async def reconfigure(self, config: dict[str, Any]) -> None:
        if self.local is not None:
            # Weights first: a hot reload finishes before the new split routes to them.
            await self.local.reconfigure(dict(config.get("local") or {}))
        self.config = config
        self.publisher.configure(config.get("telemetry") or {})
        self.groups = dict(config.get("groups") or {})
        self.guard = GuardConfig.from_dict(config.get("guard"))
        breaker_config = BreakerConfig.from_dict(config.get("breaker"))
        breakers = {}
        for name, group in self.groups.items():
            key = f"{group.get('app')}@{group.get('version')}"
            current = self.breakers.get(key)
            if current is None or current.config != breaker_config:
                current = CircuitBreaker(breaker_config)
            breakers[key] = current
            if group.get("local"):
                self.handles[name] = (group["app"], None)
            elif name not in self.handles or self.handles[name][0] != group["app"]:
                handle = serve.get_deployment_handle("version", app_name=group["app"])
                self.handles[name] = (group["app"], handle)
        self.breakers = breakers
        self.handles = {n: h for n, h in self.handles.items() if n in self.groups}
        slots = int(config.get("pool_slots") or 0)
        if slots != self._pool_slots:  # requests in flight give their slot back to the old gate
            self._pool_slots = slots
            self._pool_gate = asyncio.Semaphore(slots) if slots > 0 else None

    def _blocked(self) -> Refused | None:
        """The platform's refusal of every request of this deployment, or None: a suspended
        tenant, a tenant whose access to its shared pool was revoked."""
        reason = str(self.config.get("suspended") or "")
        if reason:
            return Refused(403, "tenant_suspended", f"this tenant is suspended: {reason}")
        if self.config.get("pool_access_revoked"):
            return Refused(403, "pool_access_revoked",
                           "this tenant's access to its shared pool was revoked by the "
                           "platform")  # fmt: skip
        return None

    def check_health(self) -> None:
        """Serve's health check of the router replica is also the in-process stable slot's."""
        if self.local is not None:
            self.local.check_health()

    def _breaker(self, group: str) -> CircuitBreaker:
        info = self.groups[group]
        return self.breakers[f"{info.get('app')}@{info.get('version')}"]

    async def __call__(self, request: Request) -> Response:
        root = request.scope.get("root_path", "")
        path = request.url.path[len(root) :] if request.url.path.startswith(root) else ""
        trace = continue_trace(request.headers.get("traceparent"))
        # Serve's proxy assigns x-request-id and echoes it in the response itself. A client's
        # own id is kept only when short: the version keys sequences by (tenant, id).
        request_id = request.headers.get("x-request-id") or ""
        if not 0 < len(request_id) <= MAX_REQUEST_ID:
            request_id = f"req-{secrets.token_hex(8)}"
        headers = {"traceparent": trace.header}
        raw_key = bearer(request.headers.get("authorization"))
        key_ok = key_matches(raw_key, self.config.get("key_hashes", []))
        tenant = self.config.get("tenant")
        probe_identity = None
        if not key_ok and raw_key and self.local is not None:
            # A kv_pollution_probe drill's key, accepted only while its fault is in force: the
            # request runs as the drill's synthetic tenant on the in-process stable slot.
            probe_identity = self.local.chaos.probe_identity(hash_key(raw_key))
            key_ok, tenant = probe_identity is not None, probe_identity or tenant
        blocked = self._blocked()
        if path.rstrip("/") == "/v1/models" and request.method == "GET" and key_ok and not blocked:
            return JSONResponse(self._models(), headers=headers)
        life = Lifecycle(request_id)
        self.recent.add(life)
        # Bound once per request: a reconfigure (new split, canary gone) may land mid-request.
        breaker: CircuitBreaker | None = None
        try:
            life.to(VALIDATING)
            if not key_ok:
                raise Refused(401, "invalid_api_key", "missing or unknown inference key")
            if blocked is not None:  # before the body is read or any version is asked
                raise blocked
            kind = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(
                path.rstrip("/")
            )
            if kind is None or request.method != "POST":
                raise Refused(404, "not_found", f"no route {request.method} {path or '/'}")
            body = parse_body(await request.body(), self.guard)
            sampling = openai.sampling_fields(body)
            check_lengths(0, sampling["max_tokens"], self.guard)
            prompt = openai.prompt_of(kind, body)
            life.to(ROUTING)
            requested = "stable" if probe_identity else request.headers.get("x-ab-group")
            group = self._route(requested)
            breaker, handle = self._breaker(group), self.handles[group][1]
            life.group = group
            headers["x-ab-group"] = group
            headers["x-model-version"] = str(self.groups[group].get("version", ""))
            payload = {
                "request_id": request_id,
                "tenant": tenant,
                "prompt": prompt,
                "sampling": sampling,
                "guard": self.config.get("guard") or {},
                "traceparent": trace.child().header,
            }
            life.to(EXECUTING)
            model = str(self.config.get("deployment", "model"))
            slot = await _PoolSlot.take(self._pool_gate if handle is not None else None)
            try:
                if sampling["stream"]:
                    if handle is None:
                        stream = self._local().generate(payload)
                    else:
                        stream = handle.options(stream=True).generate.remote(payload)
                    first = await stream.__anext__()  # surfaces refusals before the 200
                    events = self._sse(kind, request_id, model, breaker, first, stream, life, slot)
                    slot.hand_to(events)
                    return StreamingResponse(
                        events, media_type="text/event-stream", headers=headers
                    )
                if handle is None:
                    answer = await self._local().complete(payload)
                else:
                    answer = await handle.complete.remote(payload)
            finally:
                slot.release_unless_handed()
            text, reason, usage = answer["text"], answer["finish_reason"], answer["usage"]
            breaker.record(True)
            life.to(COMPLETED)
            return JSONResponse(
                openai.completion_body(kind, request_id, model, text, reason, usage),
                headers=headers,
            )
        except Refused as exc:
            return self._fail(life, exc, headers)
        except Exception as exc:  # the version failed: counts against its breaker
            refused = _unwrap_refused(exc)
            if refused is not None:
                return self._fail(life, refused, headers)
            if breaker is not None:
                breaker.record(False)
            # A drill's error burst answers with the status it asks for; any other failure
            # of the version is a 502.
            injected = _unwrap_as(exc, InjectedFault)
            status = 502 if injected is None else injected.status
            reason = _short(exc) if injected is None else injected.message
            upstream = Refused(status, "upstream_error", f"model version failed: {reason}")
            return self._fail(life, upstream, headers)

    def _local(self) -> VersionCore:
        if self.local is None:
            raise Refused(503, "no_version", "this router serves no version in-process")
        return self.local

    def _fail(self, life: Lifecycle, exc: Refused, headers: dict[str, str]) -> Response:
        if not life.done:
            life.to(FAILED, error=exc.message)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    def _route(self, requested: str | None) -> str:
        if "stable" not in self.groups:
            raise Refused(503, "no_version", "this deployment has no version to serve")
        percent = float(self.config.get("canary_percent", 0))
        group = choose_group(percent, requested, has_canary="canary" in self.groups)
        if self._breaker(group).allow():
            return group
        other = "stable" if group == "canary" else "canary"
        if other in self.groups and self._breaker(other).allow():
            return other
        raise Refused(503, "circuit_open", f"the {group} version's circuit breaker is open")

    async def _sse(
        self,
        kind: str,
        request_id: str,
        model: str,
        breaker: CircuitBreaker,
        first: dict[str, Any],
        stream: Any,
        life: Lifecycle,
        slot: _PoolSlot | None = None,
    ) -> AsyncIterator[bytes]:
        try:
            async for event in _chain(first, stream):
                if event["type"] == "token":
                    yield openai.chunk_event(kind, request_id, model, event["text"], None)
                elif event["type"] == "end":
                    yield openai.chunk_event(kind, request_id, model, "", event["finish_reason"])
            yield openai.DONE
            breaker.record(True)
            life.to(COMPLETED)
        except Exception as exc:
            breaker.record(False)
            life.to(FAILED, error=_short(exc))
            error = Refused(502, "upstream_error", f"model version failed: {_short(exc)}")
            yield f"data: {json.dumps(error.body())}\n\n".encode()
        finally:
            if slot is not None:
                slot.release()

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": str(self.config.get("deployment")), "object": "model",
                 "version": g.get("version"), "group": name}
                for name, g in self.groups.items()
            ],
        }  # fmt: skip

    def stats(self) -> dict[str, Any]:
        return {
            "app": _app_name(),
            "replica": self.replica,
            "at": time.time(),
            "pid": os.getpid(),
            "breakers": {n: self._breaker(n).snapshot() for n in self.groups},
            "recent": self.recent.snapshot()[-50:],
            "config_digest": hashlib.sha256(repr(sorted(self.config)).encode()).hexdigest()[:12],
        }

    def version_stats(self) -> dict[str, Any]:
        """The in-process stable slot's stats (what `VersionServer.stats` says for a slot
        served on its own)."""
        return self.local.stats() if self.local is not None else {}


class _PoolSlot:
    """One of a shared deployment's pool slots (a permit of the router's gate), given back
    exactly once: when the answer is done, when a stream ends, or, for a stream the client
    dropped before it started (whose generator never runs its clean-up), when the stream
    object is collected."""

    def __init__(self, gate: asyncio.Semaphore | None) -> None:
        self._gate = gate
        self._handed = False

    @classmethod
    async def take(cls, gate: asyncio.Semaphore | None) -> _PoolSlot:
        if gate is not None:
            await gate.acquire()
        return cls(gate)

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.release()

    def hand_to(self, owner: object) -> None:
        """`owner` (the response's body stream) gives the slot back from now on."""
        if self._gate is not None:
            self._handed = True
            weakref.finalize(owner, self.release)

    def release_unless_handed(self) -> None:
        if not self._handed:
            self.release()


async def _publish_router(redis: Any, prefix: str, snapshot: dict[str, Any]) -> None:
    """`<prefix>:router:<app>`: one JSON value per router replica (breakers, the last
    request lifecycles with their timestamps)."""
    key = f"{prefix}:router:{snapshot['app']}"
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(key, snapshot["replica"], json.dumps(snapshot, separators=(",", ":")))
        pipe.expire(key, 10)
        await pipe.execute()


async def _chain(first: dict[str, Any], rest: Any) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for item in rest:
        yield item


def _forget_tenant(engine: Any, tenant: str) -> bool:
    """Give back every cached KV block of `tenant` (its quota set to 0, each allocation
    recycles one of its own cached blocks, which is then released as free), then drop its
    counters once it holds no block. True when nothing of it is left."""
    # Under the engine thread's lock: the pool is only ever touched between two steps.
    with engine._lock:
        pool = engine.engine.pool
        if tenant not in pool.stats:
            return True
        pool.quotas[tenant] = 0
        while (block := pool.allocate(tenant)) is not None:
            pool.release([block])
        if pool.stats[tenant].blocks_used > 0:  # its last requests still run
            return False
        del pool.stats[tenant]
        pool.quotas.pop(tenant, None)
        return True


def _engine_refusal(exc: Exception) -> Refused | None:
    """The client's answer for what the engine refuses; None: the version's own failure."""
    from serving.engine.engine import DuplicateRequest, EngineFull

    if isinstance(exc, EngineFull):
        return Refused(429, "kv_quota_exceeded", str(exc))
    if isinstance(exc, DuplicateRequest):
        return Refused(409, "duplicate_request_id", f"{exc}: choose another x-request-id")
    if isinstance(exc, ValueError):
        return Refused(400, "context_length_exceeded", str(exc))
    return None


def _unwrap_refused(exc: BaseException) -> Refused | None:
    """A Refused raised inside the version replica arrives wrapped by Ray."""
    return _unwrap_as(exc, Refused)


def _unwrap_as(exc: BaseException, kind: type[_E]) -> _E | None:
    """`exc` or the exception of type `kind` it wraps (Ray wraps a replica's exceptions)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        cause = getattr(seen, "cause", None)
        seen = cause if isinstance(cause, BaseException) else seen.__cause__
    return None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def build_router(args: dict[str, Any]) -> Any:
    """Application builder for `serving.dataplane.app:build_router`."""
    local = args.get("local")
    return Router.bind(local=dict(local) if local else None)  # type: ignore[attr-defined]


def build_version(args: dict[str, Any]) -> Any:
    """Application builder for `serving.dataplane.app:build_version`."""
    return VersionServer.bind(  # type: ignore[attr-defined]
        app=str(args["app"]),
        group=str(args.get("group", "stable")),
        engine=dict(args.get("engine") or {}),
        arch_key=str(args.get("arch_key", "")),
    )
