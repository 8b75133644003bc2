"""The router: the ingress Serve deployment of one portal deployment (key check, guard, traffic
split, circuit breakers, OpenAI-style answers), with the pool slots and Ray-unwrapping helpers."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import os
import secrets
import time
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from serving.dataplane import openai, sticky, tiers, tracing
from serving.dataplane.answers import (
    publish_router,
    short_error,
    sse_events,
    unwrap_as,
    unwrap_refused,
)
from serving.dataplane.breaker import BreakerConfig, CanaryBreaker, CircuitBreaker
from serving.dataplane.faults import InjectedFault
from serving.dataplane.guard import GuardConfig, Refused, check_lengths, parse_body
from serving.dataplane.handles import PoolSlot, Retired, Retirements
from serving.dataplane.keys import bearer, hash_key, key_matches, key_priority
from serving.dataplane.lifecycle import (
    COMPLETED,
    EXECUTING,
    FAILED,
    REQUEST_ID,
    ROUTING,
    VALIDATING,
    Lifecycle,
    RecentRequests,
)
from serving.dataplane.mirror import Mirrors
from serving.dataplane.prompt_sample import PromptSampler
from serving.dataplane.publisher import Publisher, app_name, replica_id
from serving.dataplane.traffic import (
    TraceContext,
    choose_group,
    continue_trace,
    incoming_trace,
    trace_headers,
)
from serving.dataplane.version import VersionCore

LOCAL_SERVER = "serving.dataplane.version:VersionCore"


def import_object(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _version_key(group: dict[str, Any]) -> str:
    """A version's breaker key: its application and version (a canary promoted in place is
    another key)."""
    return f"{group.get('app')}@{group.get('version')}"


@serve.deployment(name="router")
class Router:
    """The ingress of one portal deployment. A dedicated deployment's stable slot runs inside
    this replica (`local`): stable requests cost no extra actor hop; the canary (and a
    shared pool) is reached through a deployment handle."""

    def __init__(self, local: dict[str, Any] | None = None) -> None:
        self.local: VersionCore | None = None
        tracing.configure()
        if local:
            core = import_object(str(local.get("server") or LOCAL_SERVER))
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
        self.tiers = tiers.TierRouter(self)  # degraded modes (serving.dataplane.tiers)
        self.retirements = Retirements()
        self.recent = RecentRequests()
        self.split = sticky.SplitTracker()  # client keys' groups (serving.dataplane.sticky)
        self.replica = replica_id()
        self.publisher = Publisher(self.stats, publish_router)
        self.sample = PromptSampler(self.publisher)  # a drill's sample of the prompts
        self.mirrors = Mirrors(self)  # a suspect canary's calls (serving.dataplane.mirror)
        # A shared deployment's share of the pool's request slots: at most this many of the
        # tenant's requests are in the pool at once, the rest wait here, in its own router.
        self._pool_gate: asyncio.Semaphore | None = None
        self._pool_slots = 0

    def __del__(self) -> None:
        """Serve stops the router: its in-process stable slot says so (a vLLM one also stops
        its engine); a stand-in core without a destructor has nothing to say."""
        local, publisher = getattr(self, "local", None), getattr(self, "publisher", None)
        for stop in (getattr(local, "__del__", None), getattr(publisher, "stop", None)):
            if stop is not None:
                stop()

    async def reconfigure(self, config: dict[str, Any]) -> None:
        if self.local is not None:
            # Weights first: a hot reload finishes before the new split routes to them.
            await self.local.reconfigure(dict(config.get("local") or {}))
        self.config = config
        self.publisher.configure(config.get("telemetry") or {})
        self.sample.configure(config)
        self.groups = dict(config.get("groups") or {})
        self.split.configure(config)
        self.tiers.configure(config.get("tiers"))
        self.guard = GuardConfig.from_dict(config.get("guard"))
        self.breakers = self._breakers_for(config)
        for name, group in self.groups.items():
            if group.get("local"):
                self.handles[name] = (group["app"], None)
            elif name not in self.handles or self.handles[name][0] != group["app"]:
                handle = serve.get_deployment_handle("version", app_name=group["app"])
                self.handles[name] = (group["app"], handle)
        self.handles = {n: h for n, h in self.handles.items() if n in self.groups}
        self.retirements.keep(app for app, handle in self.handles.values() if handle is not None)
        slots = int(config.get("pool_slots") or 0)
        if slots != self._pool_slots:  # requests in flight give their slot back to the old gate
            self._pool_slots = slots
            self._pool_gate = asyncio.Semaphore(slots) if slots > 0 else None

    def _breakers_for(self, config: dict[str, Any]) -> dict[str, CircuitBreaker]:
        """A breaker per version (kept across reconfigures while its settings hold); the
        canary's is held against the stable's at the canary's share of the traffic."""
        groups = dict(config.get("groups") or {})
        settings = BreakerConfig.from_dict(config.get("breaker"))
        keys = {name: _version_key(group) for name, group in groups.items()}
        breakers: dict[str, CircuitBreaker] = {}
        for name in sorted(groups, key=lambda n: n != "stable"):  # the stable's first
            current = self.breakers.get(keys[name])
            canary = name == "canary" and "stable" in groups
            kept = current is not None and current.config == settings
            if current is None or not kept or canary != isinstance(current, CanaryBreaker):
                current = CircuitBreaker(settings)
                if canary:
                    baseline = breakers[keys["stable"]]
                    current = CanaryBreaker(settings, baseline=baseline, share=0.0)
            if isinstance(current, CanaryBreaker):
                current.baseline = breakers[keys["stable"]]
                current.share = float(config.get("canary_percent", 0)) / 100
            breakers[keys[name]] = current
        return breakers

    def _blocked(self) -> Refused | None:
        """The platform's refusal of every request of this deployment, or None: a suspended
        tenant, a tenant whose access to its shared pool was revoked."""
        reason = str(self.config.get("suspended") or "")
        if reason:
            return Refused(403, "tenant_suspended", f"this tenant is suspended: {reason}")
        if self.config.get("pool_access_revoked"):
            return Refused(
                403,
                "pool_access_revoked",
                "this tenant's access to its shared pool was revoked by the platform",
            )
        return None

    def check_health(self) -> None:
        """Serve's health check of the router replica is also the in-process stable slot's."""
        if self.local is not None:
            self.local.check_health()

    def _breaker(self, group: str) -> CircuitBreaker:
        return self.breakers[_version_key(self.groups[group])]

    async def __call__(self, request: Request) -> Response:
        """One request, in the router's span (a stream's ends with its last event)."""
        client_trace = incoming_trace(request.headers)  # traceparent, else B3
        span = tracing.router_span(
            client_trace[0], {"portal.app": app_name(), "http.request.method": request.method}
        )
        try:
            response = await self._serve(request, span, client_trace)
        except BaseException:
            tracing.finish(span, 500)
            raise
        status = response.status_code
        if isinstance(response, StreamingResponse):
            response.body_iterator = tracing.ending(response.body_iterator, span, status)
        else:
            tracing.finish(span, status)
        return response

    async def _serve(
        self, request: Request, span: Any, client_trace: tuple[str | None, str]
    ) -> Response:
        root = request.scope.get("root_path", "")
        path = request.url.path[len(root) :] if request.url.path.startswith(root) else ""
        # With tracing on, the response's traceparent is the router span's: one trace end to end.
        recorded = tracing.ids(span) if span.is_recording() else None  # else: a span of ours
        trace = TraceContext(*recorded) if recorded else continue_trace(client_trace[0])
        # Serve's proxy assigns x-request-id and echoes it in the response itself. A client's
        # own id is kept only when short and visible ASCII: the version keys sequences by
        # (tenant, id), and the request inspector finds requests by it.
        request_id = request.headers.get("x-request-id") or ""
        if not REQUEST_ID.match(request_id):
            request_id = f"req-{secrets.token_hex(8)}"
        headers = trace_headers(trace, client_trace[1])
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
            return JSONResponse(openai.models_body(self.config, self.groups), headers=headers)
        life = Lifecycle(request_id, trace_id=trace.trace_id)
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
            self.sample.offer(tenant, raw_key, prompt, probe_identity)
            life.to(ROUTING)
            client = None if probe_identity else self.split.client(request.headers, body)
            percent = float(self.config.get("canary_percent", 0))
            requested = self.split.requested(client, percent, request.headers.get("x-ab-group"))
            payload = {
                "request_id": request_id,
                "tenant": tenant,
                "priority": key_priority(raw_key, self.config),  # the engine's class
                "prompt": prompt,
                "messages": openai.messages_of(body) if kind == "chat" else None,
                "sampling": sampling,
                "guard": self.config.get("guard") or {},
                "traceparent": tracing.header(span) or trace.child().header,
            }
            # A suspect canary's clients: the stable answers, the canary gets a mirror.
            routed = self.tiers.route(
                prompt, "stable" if probe_identity else requested, probe_identity
            )
            group = life.group = self.mirrors.divert(routed, payload)
            breaker, handle = self._breaker(group), self.handles[group][1]
            sticky.version_headers(headers, group, self.config)
            life.to(EXECUTING)
            model = str(self.config.get("deployment", "model"))
            slot = await PoolSlot.take(self._pool_gate if handle is not None else None)
            started = time.monotonic()  # the version's time to answer (a stream's first event)
            try:
                try:
                    answer, stream = await self._execute(group, payload, sampling["stream"])
                except Exception as exc:
                    # Promoted or rolled back while this request waited for the canary (its
                    # replicas are gone), or a canary that never answered yet (Serve is still
                    # bringing it up): the stable slot answers, nothing is held against it.
                    if not self._to_stable(group, breaker, exc):
                        raise
                    group = life.group = "stable"
                    breaker = self._breaker(group)
                    answer, stream = await self._execute(group, payload, sampling["stream"])
                took = time.monotonic() - started
                # Which weights answered (a replica mid-rollout may still hold the old ones).
                sticky.version_headers(headers, group, self.config, answer)
                life.answered(answer)
                self.split.observe(client, group)
                if stream is not None:
                    events = sse_events(
                        kind, request_id, model, (breaker, took), answer, stream, life, slot
                    )
                    slot.hand_to(events)
                    return StreamingResponse(
                        events, media_type="text/event-stream", headers=headers
                    )
            finally:
                slot.release_unless_handed()
            text, reason, usage = answer["text"], answer["finish_reason"], answer["usage"]
            breaker.record(True, took)
            life.to(COMPLETED)
            return JSONResponse(
                openai.completion_body(kind, request_id, model, text, reason, usage),
                headers=headers,
            )
        except Refused as exc:
            return self._fail(life, exc, headers)
        except Exception as exc:  # the version failed: counts against its breaker
            refused = unwrap_refused(exc)
            if refused is not None:
                return self._fail(life, refused, headers)
            if breaker is not None:
                breaker.record(False)
            # A drill's error burst answers with the status it asks for; any other failure
            # of the version is a 502.
            injected = unwrap_as(exc, InjectedFault)
            status = 502 if injected is None else injected.status
            reason = short_error(exc) if injected is None else injected.message
            upstream = Refused(status, "upstream_error", f"model version failed: {reason}")
            return self._fail(life, upstream, headers)

    async def _execute(
        self, group: str, payload: dict[str, Any], stream: bool
    ) -> tuple[dict[str, Any], Any]:
        """(the answer, None), or for a stream (its first event, the rest): the first event
        surfaces a refusal before the 200. A call by handle raises Retired when its
        application is retired before it answers."""
        if group not in self.handles:  # a reconfigure dropped it since the request was routed
            raise Retired(group)
        app, handle = self.handles[group]
        if handle is None:
            if stream:
                events = self._local().generate(payload)
                return await events.__anext__(), events
            return await self._local().complete(payload), None
        if stream:
            events = handle.options(stream=True).generate.remote(payload)
            return await self.retirements.first(app, events, events.__anext__()), events
        response = handle.complete.remote(payload)
        return await self.retirements.first(app, response, response), None

    def _to_stable(self, group: str, breaker: CircuitBreaker, exc: Exception) -> bool:
        """Does the stable slot answer a request the canary failed? Retired; or, unless a drill
        injected it or the canary refused, while the canary starts (CanaryBreaker.starting)."""
        if group != "canary" or "stable" not in self.groups:
            if isinstance(exc, Retired):
                raise Refused(503, "no_version", "the version was retired") from None
            return False
        if isinstance(exc, Retired):
            return True
        if unwrap_as(exc, InjectedFault) is not None or unwrap_refused(exc) is not None:
            return False  # a drill's failure, or the canary's own refusal: the client sees it
        return isinstance(breaker, CanaryBreaker) and breaker.starting()  # starts its clock

    def _local(self) -> VersionCore:
        if self.local is None:
            raise Refused(503, "no_version", "this router serves no version in-process")
        return self.local

    def _fail(self, life: Lifecycle, exc: Refused, headers: dict[str, str]) -> Response:
        if not life.done:
            life.to(FAILED, error=exc.message, status=exc.status, code=exc.code)
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

    def stats(self) -> dict[str, Any]:
        return {
            "app": app_name(),
            "replica": self.replica,
            "at": time.time(),
            "pid": os.getpid(),
            "breakers": {n: self._breaker(n).snapshot() for n in self.groups},
            "tier": self.tiers.snapshot(),
            "requests": self.recent.snapshot(),  # published apart (answers.publish_router)
            "split": self.split.snapshot(),
            "config_digest": hashlib.sha256(repr(sorted(self.config)).encode()).hexdigest()[:12],
        }

    def version_stats(self) -> dict[str, Any]:
        """The in-process stable slot's stats (what `VersionServer.stats` says for a slot
        served on its own)."""
        return self.local.stats() if self.local is not None else {}
