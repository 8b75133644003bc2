"""HTTP requests for /metrics: a middleware counts every request by method, route name and
status class, with its latency (to the response object: a streamed body's transfer is not
in it), first in this process, then adds the counts to one Redis hash at most once a second.
/metrics reads the hash, so whichever web process answers a scrape reports the requests of
all of them (at most a second late; a process that dies loses its last second). Labels are
bounded: the URL conf's route names, never a path; unknown methods count as `OTHER`."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FLUSH_EVERY_S = 1.0
RETRY_AFTER_S = 5.0  # Redis away: keep counting here, try again later
_SEP = "\x1f"  # in no method, route name or status class

Key = tuple[str, str, str]  # method, route, status class


@dataclass
class Totals:
    """Requests of one (method, route, status class): count, latency sum (s), and per-bucket
    counts, not cumulative (the last one holds what is above every bound)."""

    count: int = 0
    sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))

    def add(self, other: Totals) -> None:
        self.count += other.count
        self.sum += other.sum
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


class _Pending:
    """What this process counted since its last flush."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals: dict[Key, Totals] = {}
        self.next_flush = 0.0

    def observe(self, key: Key, seconds: float) -> None:
        with self.lock:
            totals = self.totals.get(key)
            if totals is None:
                totals = self.totals[key] = Totals()
            totals.count += 1
            totals.sum += seconds
            totals.buckets[bisect.bisect_left(BUCKETS_S, seconds)] += 1

    def take(self, now: float, force: bool) -> dict[Key, Totals] | None:
        with self.lock:
            if not self.totals or (not force and now < self.next_flush):
                return None
            taken, self.totals = self.totals, {}
            self.next_flush = now + FLUSH_EVERY_S
            return taken

    def give_back(self, taken: dict[Key, Totals], now: float) -> None:
        with self.lock:
            for key, totals in taken.items():
                self.totals.setdefault(key, Totals()).add(totals)
            self.next_flush = now + RETRY_AFTER_S


_PENDING = _Pending()
_clients: dict[str, Any] = {}


def _redis() -> Any:
    """A client with short timeouts: a request never waits long for its metrics."""
    url = settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(
            url, socket_timeout=0.5, socket_connect_timeout=0.5
        )
    return client


def redis_key() -> str:
    return f"{settings.SLI_KEY_PREFIX}:http:requests"


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


def route_of(request: HttpRequest) -> str:
    """The URL conf's name of the route (its pattern where it has none); `static` for static
    files, `unmatched` for a path no route matched."""
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return str(match.view_name or match.route or "unnamed")
    if request.path.startswith(str(settings.STATIC_URL)):
        return "static"
    return "unmatched"


def observe(method: str, route: str, status: int, seconds: float) -> None:
    method = method.upper() if method and method.upper() in METHODS else "OTHER"
    _PENDING.observe((method, route, status_class(status)), seconds)


def flush(*, force: bool = False) -> bool:
    """Add what this process counted to the shared hash (at most once a second unless
    `force`); False when there was nothing to add or Redis did not take it."""
    now = time.monotonic()
    taken = _PENDING.take(now, force)
    if taken is None:
        return False
    try:
        key = redis_key()
        with _redis().pipeline(transaction=False) as pipe:
            for (method, route, klass), totals in taken.items():
                prefix = _SEP.join((method, route, klass)) + _SEP
                pipe.hincrby(key, prefix + "count", totals.count)
                pipe.hincrbyfloat(key, prefix + "sum", totals.sum)
                for index, n in enumerate(totals.buckets):
                    if n:
                        pipe.hincrby(key, f"{prefix}b{index}", n)
            pipe.execute()
    except redis.RedisError as exc:
        logger.debug("HTTP metrics kept in this process for now: %s", exc)
        _PENDING.give_back(taken, now)
        return False
    return True


def http_totals(redis_client: Any = None) -> dict[Key, Totals]:
    """Every process's flushed requests, by (method, route, status class)."""
    r = redis_client or _redis()
    out: dict[Key, Totals] = {}
    for raw_field, raw_value in r.hgetall(redis_key()).items():
        parts = raw_field.decode().split(_SEP)
        if len(parts) != 4:
            continue
        method, route, klass, name = parts
        totals = out.setdefault((method, route, klass), Totals())
        if name == "count":
            totals.count = int(raw_value)
        elif name == "sum":
            totals.sum = float(raw_value)
        elif name.startswith("b") and name[1:].isdigit() and int(name[1:]) < len(totals.buckets):
            totals.buckets[int(name[1:])] = int(raw_value)
    return out


class HttpMetricsMiddleware:
    """Counts every response the inner middleware and views produce (errors included: Django
    turns an exception into a response below this one)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        observe(
            request.method or "",
            route_of(request),
            response.status_code,
            time.perf_counter() - started,
        )
        flush()
        return response
