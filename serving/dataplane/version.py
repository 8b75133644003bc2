"""A version slot's engine: VersionCore (weights hot-reloaded from user_config, tenants' salts and
quotas, faults, SLI window) and VersionServer, the same as its own Serve deployment."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from serving.dataplane import tracing
from serving.dataplane.engine_calls import engine_refusal, forget_tenant
from serving.dataplane.faults import FaultInjector
from serving.dataplane.guard import GuardConfig, Refused, check_lengths
from serving.dataplane.keys import request_priority
from serving.dataplane.kv_checks import KvChecks
from serving.dataplane.openai import first_stop
from serving.dataplane.publisher import Publisher, replica_id
from serving.dataplane.sli import SliRecorder, farewell, publish
from serving.dataplane.standby import Standby
from serving.dataplane.weights import WeightLoading

logger = logging.getLogger("ray.serve")


class VersionCore(WeightLoading):
    """One version slot's engine: weights (hot-reloaded from user_config), tenants' cache salts
    and quotas, faults, SLI window. Runs as its own Serve deployment (`VersionServer`: a
    canary, a shared pool) or inside the router's replica for the stable slot."""

    def __init__(self, app: str, group: str, engine: dict[str, Any], arch_key: str = "") -> None:
        self.app, self.group = app, group
        tracing.configure()  # spans over OTLP when the portal passed an endpoint
        self.engine_options = engine
        self.arch_key = arch_key  # changes only with the architecture: forces new replicas
        self.engine: Any = None
        self.tokenizer: Any = None
        self.chat: Any = None  # the checkpoint's chat template (serving.engine.chat), if any
        self.loaded: dict[str, Any] = {}
        self.tenants: dict[str, dict[str, Any]] = {}
        self.faults: dict[str, Any] = {}
        self.reloads: list[dict[str, Any]] = []
        self.recorder = SliRecorder(app, group, "", replica_id(), engine)
        # Started now: a drill's crash/hang faults spare replicas started after it was issued.
        self.chaos = FaultInjector(self.recorder.replica, started_at=time.time())
        self.publisher = Publisher(self._published, publish)
        self._load_lock = asyncio.Lock()
        self._reload_key: tuple[Any, ...] | None = None  # weight_swap_jitter's, last seen
        self._probe_identities: set[str] = set()  # kv_pollution_probe tenants seen here
        self._departed: set[str] = set()  # tenants taken off this version, blocks to give back
        self.fetched: dict[str, Any] = {}  # how the loaded weights reached this node
        self.standby = Standby()  # the last good weights, in memory (serving.dataplane.standby)
        self.kv_checks = KvChecks()  # cache lifetime policy and integrity scan

    def stop(self) -> None:
        """Serve is stopping this replica on purpose: publish no more and say so, so that the
        health check does not count it lost (a crash never gets here). Idempotent."""
        publisher = getattr(self, "publisher", None)  # None: __init__ did not finish
        if publisher is None or getattr(self, "_stopped", False):
            return
        self._stopped = True
        url, prefix = publisher.redis_url, publisher.prefix
        publisher.stop()
        # Serve stops a replica that failed its health check gracefully too: that one is lost
        # (a hung engine, a replica_hang drill), not stopped on purpose.
        if url and not getattr(self, "_unhealthy", False):
            farewell(url, prefix, self.recorder)

    def __del__(self) -> None:
        """Serve calls this when it stops the replica gracefully (a scale-down, a rollout's
        old replicas, a delete); a process that exits or is killed never does."""
        self.stop()

    def _published(self) -> dict[str, Any]:
        """Once a second: the SLI window for Redis, after giving back what a departed probe
        identity left in the KV cache (a fault that expired ends without a reconfigure)."""
        self._forget_departed_probes()
        self.kv_checks.report(self.engine, self)  # the integrity pass, once a second
        return self.recorder.roll(kv=self._kv_stats(), loaded=self.loaded)

    def _kv_stats(self) -> dict[str, Any]:
        metrics = self.engine.metrics() if self.engine is not None else {}
        forced = [r for r in self.reloads if r.get("nonce") is not None]
        keys = ("drill", "nonce", "ok", "s", "at")
        reload = {k: forced[-1].get(k) for k in keys} if forced else None
        return {
            **metrics,
            "fault_leaked_mb": round(self.chaos.leaked_mb, 1),
            "faults": self.chaos.report(),  # a drill confirms its fault took effect from it
            "fault_reload": reload,
            "artifact_fetch": self.fetched,
            "standby": self.standby.snapshot(self.reloads),
            "integrity": self.kv_checks.last,
        }

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
            if hasattr(self.engine, "set_memory_caps"):  # built-in engine; vLLM sizes itself
                self.engine.set_memory_caps(config.get("gpu_memory_mb") or {}, shared=shared)
            if shared:  # each pool tenant runs at most its share of the batch at once
                limits = {
                    t: int(v["max_running"]) for t, v in self.tenants.items() if v["max_running"]
                }
                self.engine.set_limits(limits, 1)
            else:
                self.engine.set_limits({}, None)
            self.kv_checks.configure(self.engine, config)
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
            if forget_tenant(self.engine, tenant):
                self._departed.discard(tenant)
        if not self._probe_identities:
            return
        probe = self.chaos.active().kv_pollution_probe
        current = probe.identity if probe is not None else None
        for identity in sorted(self._probe_identities - {current}):
            if forget_tenant(self.engine, identity):
                self._probe_identities.discard(identity)

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
        messages, chat = request.get("messages"), self.chat
        try:  # a chat through the model's own template, when it has one
            prompt = chat.render(messages) if messages and chat else request["prompt"]
        except ValueError as exc:
            raise Refused(400, "chat_template_error", str(exc)[:300]) from exc
        prompt_ids = self.tokenizer.encode(prompt).ids
        sampling = request["sampling"]
        guard = GuardConfig.from_dict(request.get("guard"))
        ok, first_at, times, out_ids, queued, hits = False, None, [], [], None, None
        submitted: float | None = None
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
            request_id, priority = str(request["request_id"]), request_priority(request)
            stream = self._submit(prompt_ids, params, tenant, request_id, salt, priority=priority)
            submitted = time.time()
            yield {
                "type": "start",
                "prompt_tokens": len(prompt_ids),
                "version": self.loaded.get("version"),
                "fingerprint": self.loaded.get("fingerprint"),
                "pid": os.getpid(),
                "replica": self.recorder.replica,
            }
            text = ""  # what was sent; a stop sequence's possible start is held back
            reason = None
            stops = list(sampling.get("stop") or ())
            hold = max((len(s) for s in stops), default=1) - 1
            async for event in stream:
                if event.token_id >= 0:  # vLLM may end a stream without a new token
                    out_ids.append(event.token_id)
                    times.append(event.at)
                    first_at = first_at or event.at
                    queued = queued if queued is not None else getattr(event, "queued_s", None)
                # The engine's prefix-cache hit for this request (built-in: on the first token;
                # vLLM: on the last), or None where the engine does not say.
                hits = hits if hits is not None else getattr(event, "cached_tokens", None)
                full = self.tokenizer.decode(out_ids)
                if full.endswith("\ufffd") and not event.finished:
                    continue
                cut = first_stop(full, stops, max(0, len(text) - hold))
                end = cut if cut is not None else len(full) if event.finished else len(full) - hold
                if end > len(text):
                    delta, text = full[len(text) : end], full[:end]
                    yield {"type": "token", "text": delta}
                reason = "stop" if cut is not None else event.finish_reason
                if cut is not None:
                    break  # closing the stream below ends the sequence and frees its blocks
            ok = True
            yield {
                "type": "end",
                "finish_reason": reason,
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": len(out_ids),
                    "total_tokens": len(prompt_ids) + len(out_ids),
                },
                "prefix_hit_tokens": hits,
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
            clients = cancelled or (refused is not None and refused.status < 500)
            self.recorder.record(
                queued_s=queued,
                latency_s=time.time() - started,
                ok=ok,
                client_error=clients,
                ttft_s=(first_at - started) if first_at else None,
                itl_s=gaps,
                tokens_in=len(prompt_ids),
                tokens_out=len(out_ids),
            )
            if not ok and not clients:  # the version's failure: the health tick sees it sooner
                self.publisher.soon()
            tracing.version_spans(
                request,
                self._span_attributes(tenant, len(prompt_ids), len(out_ids)),
                started=started,
                submitted=submitted,
                queued_s=queued,
                first_at=first_at,
                last_at=times[-1] if times else None,
                ended=time.time(),
                error=None if ok or cancelled else (refused.code if refused else "failed"),
            )

    def _span_attributes(self, tenant: str, tokens_in: int, tokens_out: int) -> dict[str, Any]:
        return {
            "portal.app": self.app,
            "portal.group": self.group,
            "portal.tenant": tenant,
            "portal.version": str(self.loaded.get("version", "")),
            "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": tokens_out,
        }

    def _check_admissible(self, prompt_tokens: int, max_tokens: int, tenant: str) -> None:
        try:
            self.engine.check_admissible(prompt_tokens, max_tokens, tenant)
        except Exception as exc:
            refusal = engine_refusal(exc)
            if refusal is None:
                raise
            raise refusal from exc

    def _submit(
        self, prompt_ids: list[int], params: Any, tenant: str, rid: str, salt: bytes, **kw: Any
    ) -> Any:  # kw: priority (serving.dataplane.keys.request_priority)
        try:
            return self.engine.submit(
                prompt_ids, params, tenant=tenant, request_id=rid, cache_salt=salt, **kw
            )
        except Exception as exc:
            refusal = engine_refusal(exc)
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
        served = {k: start.get(k) for k in ("version", "fingerprint", "pid", "replica")}
        return {**end, "text": text, **served}

    async def _inject_faults(self) -> None:
        """Per-request faults a chaos drill switched on through user_config (delays, then
        failures: see serving.dataplane.faults)."""
        await self.chaos.before_request()

    def check_health(self) -> None:
        """Serve's periodic health check: fails while a `replica_hang` fault selects this
        replica, so Serve replaces it. A replica that failed it once says no goodbye when
        Serve stops it (`stop`): the health check counts it lost."""
        try:
            self.chaos.check_health()
        except Exception:
            self._unhealthy = True
            raise

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
