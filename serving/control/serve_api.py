"""Client for the Ray Serve REST API on the Ray dashboard: the portal's one write path into Serve.

`PUT /api/serve/applications/` applies a whole declarative config (every application at once),
`GET` reports what Serve is doing (statuses, messages, replicas), `DELETE` shuts Serve down.
The dashboard enforces Ray token auth, so every request carries `Authorization: Bearer <token>`.
Only the standard library is used, so the portal's runtime needs no HTTP client package.

A `control_plane_delay` chaos drill slows every call of this client down: each request first
waits `host.call_delay()` seconds, which the portal wires to the drill's Redis key when it
starts (serving.deployments.chaos); a bare script has no delay.

Every call goes through the dashboard's guard (serving.control.breaker): a circuit breaker that
refuses calls at once while the control plane fails or is slow, and a retry budget that keeps
retries under 10 % of the requests, so a struggling control plane never sees a retry storm.
The applications' values (AppInfo, ...) live in serving.control.serve_schema.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from serving.control import breaker, host
from serving.control.serve_schema import (
    AppInfo,
    AppStatus,
    DeploymentInfo,
    ReplicaInfo,
    absent_app,
    parse_applications,
)
from serving.dataplane.fetch import is_loopback_url

if TYPE_CHECKING:
    from serving.control.cluster.config import RayTarget

__all__ = [
    "AppInfo",
    "AppStatus",
    "DeploymentInfo",
    "ReplicaInfo",
    "ServeApiClient",
    "ServeApiError",
    "ServeCircuitOpen",
    "ServeDeployFailed",
    "ServeWaitTimeout",
    "parse_applications",
]
logger = logging.getLogger(__name__)
APPLICATIONS_PATH = "/api/serve/applications/"
DEFAULT_TIMEOUT_S = 10.0
# Serve's answers to a bad config are pydantic reprs or controller tracebacks; keep str() readable.
_MESSAGE_PREVIEW = 2000


class ServeApiError(Exception):
    """A request to the Serve REST API failed; `status` is None when no HTTP answer came back."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        serve_message: str = "",
        method: str = "",
        url: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.serve_message = serve_message
        self.method = method
        self.url = url

    def __str__(self) -> str:
        where = f"{self.method} {self.url}: ".lstrip() if self.method else ""
        status = f"HTTP {self.status}: " if self.status is not None else ""
        detail = self.serve_message or self.message
        if len(detail) > _MESSAGE_PREVIEW:
            detail = detail[:_MESSAGE_PREVIEW] + " ..."
        return f"{where}{status}{detail}"


class ServeCircuitOpen(ServeApiError):
    """Refused without a call: the dashboard's circuit breaker is open (serving.control.breaker)."""


class ServeDeployFailed(ServeApiError):
    """An application reached a failure status (DEPLOY_FAILED by default) while being waited on."""

    def __init__(self, message: str, *, apps: Mapping[str, AppInfo]) -> None:
        failed = [a for a in apps.values() if a.message]
        super().__init__(message, serve_message="\n".join(a.message for a in failed))
        self.apps = dict(apps)


class ServeWaitTimeout(ServeApiError, TimeoutError):
    """The applications did not reach the wanted statuses in time; `apps` is the last report."""

    def __init__(self, message: str, *, apps: Mapping[str, AppInfo]) -> None:
        super().__init__(message)
        self.apps = dict(apps)


class ServeApiClient:
    """Bearer-token client for one cluster's dashboard; cheap to build, holds no connection."""

    def __init__(
        self,
        dashboard_url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        http_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.dashboard_url = dashboard_url.rstrip("/")
        self.timeout = timeout
        # Serve's schema defaults the proxy to 0.0.0.0:8000; the target's options fill in what a
        # config leaves out, so a config that forgets http_options never opens the proxy to the
        # network or takes the portal's port. Serve reads them only when it (re)starts.
        self.http_options = dict(http_options or {})
        self._token = token
        handlers: list[urllib.request.BaseHandler] = []
        if is_loopback_url(self.dashboard_url):
            # An HTTP(S)_PROXY in the environment must not capture loopback traffic (and the token).
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def from_target(
        cls, target: RayTarget, *, timeout: float = DEFAULT_TIMEOUT_S
    ) -> ServeApiClient:
        return cls(
            target.dashboard_url,
            target.token,
            timeout=timeout,
            http_options=target.serve_http_options,
        )

    def __repr__(self) -> str:
        return f"ServeApiClient({self.dashboard_url!r})"

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        authenticated: bool = True,
    ) -> tuple[int, str]:
        """Send one request; return (status, text) for 2xx, raise ServeApiError otherwise.

        Guarded (serving.control.breaker): refused at once (ServeCircuitOpen) while the
        dashboard's breaker is open; an attempt without an answer or with a 5xx is tried again,
        backed off, only while the process's retry budget allows (a slow or failing control
        plane must never see a retry storm)."""
        url = self.dashboard_url + path
        if urlsplit(url).scheme not in ("http", "https"):
            raise ServeApiError("dashboard URL must be http(s)", method=method, url=url)
        guard = breaker.guard_for(self.dashboard_url)
        if not guard.allow():
            raise ServeCircuitOpen(
                "the Serve API circuit breaker is open (failed or slow calls in a row, the "
                f"last: {guard.last_error}); the next probe within {guard.settings.cooldown_s:g} s",
                method=method,
                url=url,
            )
        retries = 0
        while True:
            started = time.monotonic()
            try:
                answer = self._send(method, url, body, authenticated=authenticated)
            except ServeApiError as exc:
                failed = exc.status is None or exc.status >= 500
                guard.record(ok=not failed, latency_s=time.monotonic() - started, error=str(exc))
                if (
                    not failed
                    or retries >= guard.settings.max_retries_per_call
                    or not guard.retry_allowed()
                ):
                    raise
                retries += 1
                time.sleep(guard.settings.backoff_s * 2 ** (retries - 1))
                continue
            guard.record(ok=True, latency_s=time.monotonic() - started)
            return answer

    def _send(
        self, method: str, url: str, body: Mapping[str, Any] | None, *, authenticated: bool
    ) -> tuple[int, str]:
        delay = host.call_delay()
        if delay > 0:  # a control_plane_delay drill is in force (see the module doc)
            time.sleep(delay)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if authenticated:
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 (the URL is the configured dashboard, http(s) only)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            with exc:  # the error carries the open response; close it with the body read
                text = exc.read().decode(errors="replace").strip()
            raise ServeApiError(
                f"Serve REST API refused {method} {urlsplit(url).path}",
                status=exc.code,
                serve_message=text,
                method=method,
                url=url,
            ) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServeApiError(f"dashboard unreachable: {reason}", method=method, url=url) from exc

    # The three verbs of the API.

    def details(self) -> dict[str, Any]:
        """GET: Serve's full instance details (controller, proxies, applications, replicas)."""
        _, text = self.request("GET", APPLICATIONS_PATH)
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise ServeApiError("dashboard answered with non-JSON", serve_message=text) from exc
        if not isinstance(parsed, dict):
            raise ServeApiError("dashboard answered with unexpected JSON", serve_message=text)
        return parsed

    def put(self, config: Mapping[str, Any]) -> None:
        """PUT: apply a declarative multi-application config; returns once the controller has it.

        Applications missing from `config` are deleted by Serve; the deploy itself runs in the
        background, so follow with `wait_until`.
        """
        body = dict(config)
        if self.http_options:
            body["http_options"] = {**self.http_options, **dict(config.get("http_options") or {})}
        self.request("PUT", APPLICATIONS_PATH, body)

    def delete(self) -> None:
        """DELETE: shut Serve down on the cluster (all applications, controller and proxies)."""
        self.request("DELETE", APPLICATIONS_PATH)

    # Reading what Serve reports.

    def nodes(self) -> list[dict[str, Any]]:
        """GET Ray's state API: the cluster's nodes (node_id, state, resources_total, ...)."""
        _, text = self.request("GET", "/api/v0/nodes?limit=10000")
        try:
            listed = json.loads(text)["data"]["result"]["result"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ServeApiError(f"unexpected answer from the state API: {text[:200]}") from exc
        return [n for n in listed if isinstance(n, dict)]

    def cluster_status(self) -> dict[str, Any]:
        """GET Ray's resource accounting (per node, each resource [used, total]; the demands
        it cannot place): read by serving.control.capacity.parse_cluster_status."""
        _, text = self.request("GET", "/api/cluster_status?format=0")
        try:
            data = json.loads(text)["data"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ServeApiError(f"unexpected answer from cluster_status: {text[:200]}") from exc
        if not isinstance(data, dict):
            raise ServeApiError(f"unexpected answer from cluster_status: {text[:200]}")
        return data

    def applications(self) -> dict[str, AppInfo]:
        return parse_applications(self.details())

    def replicas(self, app: str, deployment: str | None = None) -> list[ReplicaInfo]:
        """Replica actors (id, state, pid, actor id/name, node) of an app or one deployment."""
        info = self.applications().get(app)
        if info is None:
            return []
        return [r for r in info.replicas if deployment is None or r.deployment == deployment]

    def wait_until(
        self,
        apps: Iterable[str],
        statuses: Iterable[AppStatus | str] = (AppStatus.RUNNING,),
        *,
        fail_on: Iterable[AppStatus | str] = (AppStatus.DEPLOY_FAILED,),
        deployed_after: float | None = None,
        timeout: float = 60.0,
        interval: float = 0.2,
    ) -> dict[str, AppInfo]:
        """Poll until every app in `apps` has one of `statuses` (ABSENT: Serve no longer lists it).

        `deployed_after` is a `last_deployed_time_s` read before a PUT (the controller's clock):
        until an app shows a later deploy, its status belongs to the previous config and counts
        as neither success nor failure. Raises ServeDeployFailed as soon as an app reaches a
        `fail_on` status (with Serve's message), ServeWaitTimeout after `timeout` seconds.
        """
        names = list(apps)
        wanted = {AppStatus(s) for s in statuses}
        failing = {AppStatus(s) for s in fail_on}
        deadline = time.monotonic() + timeout
        while True:
            current = self.applications()
            report = {name: current.get(name) or absent_app(name) for name in names}
            settled = {
                name: info
                for name, info in report.items()
                if info.status is AppStatus.ABSENT
                or deployed_after is None
                or info.last_deployed_time_s > deployed_after
            }
            failed = [n for n, info in settled.items() if info.status in failing]
            if failed:
                raise ServeDeployFailed(
                    f"applications {', '.join(failed)} reached "
                    + ", ".join(sorted({settled[n].status.value for n in failed})),
                    apps=report,
                )
            if len(settled) == len(names) and all(i.status in wanted for i in settled.values()):
                return report
            if time.monotonic() >= deadline:
                summary = ", ".join(f"{n}={i.status.value}" for n, i in report.items())
                raise ServeWaitTimeout(
                    f"timed out after {timeout:.0f}s waiting for "
                    f"{'/'.join(sorted(s.value for s in wanted))}: {summary}",
                    apps=report,
                )
            time.sleep(interval)
