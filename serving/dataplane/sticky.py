"""Sticky A/B assignment by a client key, and the split-consistency record the portal shows.

A request's client key is a header (`x-client-key` unless the deployment names another) or the
OpenAI body's `user` field. It is hashed with the deployment's traffic salt (HMAC-SHA256, the
salt never leaves the control plane and the router) to a bucket in [0, 100): with `sticky` on,
the canary answers a client exactly when its bucket is below the canary percent, so a client
stays on its group for a given percent, and raising the percent only moves clients from stable
to canary (never back). Without the salt nobody can pick a key that lands in a chosen group.
Requests without a key keep the random split (and the `X-AB-Group` header).

Every router replica counts, per client (by a salted hash, never the key itself) and per
group, the requests answered since the split last changed: the portal merges the replicas'
counts into the split-consistency panel (which clients always saw the same group).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serving.dataplane.guard import Refused

DEFAULT_HEADER = "x-client-key"
MAX_CLIENT_KEY = 256  # characters; a longer key is refused (sticky) or ignored (not sticky)
HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
# Headers that carry secrets, or that the proxy and the router already give a meaning to.
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "traceparent",
        "tracestate",
        "b3",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-sampled",
        "x-b3-flags",
        "x-ab-group",
        "x-request-id",
    }
)
TRACKED_CLIENTS = 1024  # per router replica, least recently seen forgotten first
PUBLISHED_CLIENTS = 100  # per router replica in its stats: flipped ones first, then recent


@dataclass(frozen=True)
class TrafficConfig:
    sticky: bool = False
    header: str = DEFAULT_HEADER
    user_field: bool = True
    salt: bytes = b""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> TrafficConfig:
        raw = raw or {}
        header = str(raw.get("client_key_header") or DEFAULT_HEADER).lower()
        if not HEADER_NAME.match(header) or header in RESERVED_HEADERS:
            header = DEFAULT_HEADER  # the portal validates it; never trust a bad one here
        return cls(
            sticky=bool(raw.get("sticky")),
            header=header,
            user_field=bool(raw.get("user_field", True)),
            salt=bytes.fromhex(str(raw.get("salt") or "")),
        )


@dataclass(frozen=True)
class Client:
    id: str  # a salted hash of the key, for the panel (never the key itself)
    bucket: float  # in [0, 100)


def bucket_of(salt: bytes, key: str) -> float:
    """The key's bucket in [0, 100): uniform, and unpredictable without `salt`."""
    digest = hmac.new(salt, b"bucket:" + key.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") * 100.0 / 2**64


def client_id(salt: bytes, key: str) -> str:
    return hmac.new(salt, b"client:" + key.encode(), hashlib.sha256).hexdigest()[:16]


def sticky_group(bucket: float, canary_percent: float) -> str:
    """Monotone in the percent: a bucket below it is the canary's."""
    return "canary" if bucket < canary_percent else "stable"


def client_of(config: TrafficConfig, headers: Mapping[str, str], body: Any) -> Client | None:
    """The request's client, or None (no key, no salt). A key over MAX_CLIENT_KEY characters
    is a 400 naming where it came from when the deployment is sticky, ignored otherwise."""
    if not config.salt:
        return None
    raw, where = headers.get(config.header), config.header
    if raw is None and config.user_field and isinstance(body, Mapping):
        user = body.get("user")
        raw, where = (user, "user") if isinstance(user, str) else (None, where)
    key = (raw or "").strip()
    if not key:
        return None
    if len(key) > MAX_CLIENT_KEY:
        if not config.sticky:
            return None
        raise Refused(
            400,
            "invalid_client_key",
            f"the client key ({where}) must be at most {MAX_CLIENT_KEY} characters",
        )
    return Client(client_id(config.salt, key), bucket_of(config.salt, key))


def requested_group(
    config: TrafficConfig, client: Client | None, canary_percent: float, ab_header: str | None
) -> str | None:
    """What the request asks of the split: its client's group when sticky, else the
    `X-AB-Group` header (the router's choose_group keeps a valid one)."""
    if config.sticky and client is not None:
        return sticky_group(client.bucket, canary_percent)
    return ab_header


def version_headers(
    headers: dict[str, str], group: str, config: Mapping[str, Any], answer: Any = None
) -> None:
    """Which group, version and weights answer: the routed group's as the router's config
    says, then what the replica that answered says it holds (a replica mid-rollout may hold
    other weights)."""
    headers["x-ab-group"] = group
    info = (config.get("groups") or {}).get(group) or {}
    headers["x-model-version"] = str(info.get("version", ""))
    fingerprint = (config.get("fingerprints") or {}).get(group)
    if fingerprint:
        headers["x-model-fingerprint"] = str(fingerprint)
    else:
        headers.pop("x-model-fingerprint", None)
    if isinstance(answer, Mapping):
        if answer.get("version"):
            headers["x-model-version"] = str(answer["version"])
        if answer.get("fingerprint"):
            headers["x-model-fingerprint"] = str(answer["fingerprint"])


class SplitTracker:
    """Per client, the requests each side of the split answered since the split last changed
    (the canary percent, the versions, stickiness); and the totals with and without a key.
    A degraded tier counts as the stable side (it serves stable's traffic)."""

    def __init__(self, size: int = TRACKED_CLIENTS) -> None:
        self.size = size
        self.config = TrafficConfig()
        self.epoch: tuple[Any, ...] = ()
        self._reset()

    def _reset(self) -> None:
        self.since = time.time()
        self.clients: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.keyed = {"stable": 0, "canary": 0}
        self.keyless = {"stable": 0, "canary": 0}
        self.forgotten = 0

    def configure(self, config: Mapping[str, Any]) -> None:
        self.config = TrafficConfig.from_dict(config.get("traffic"))
        groups = config.get("groups") or {}
        epoch = (
            float(config.get("canary_percent") or 0) if "canary" in groups else 0.0,
            tuple(sorted((str(n), str(g.get("version"))) for n, g in groups.items())),
            self.config.sticky,
            self.config.header,
            self.config.salt,
        )
        if epoch != self.epoch:
            self.epoch = epoch
            self._reset()

    def client(self, headers: Mapping[str, str], body: Any) -> Client | None:
        return client_of(self.config, headers, body)

    def requested(
        self, client: Client | None, canary_percent: float, ab_header: str | None
    ) -> str | None:
        return requested_group(self.config, client, canary_percent, ab_header)

    def observe(self, client: Client | None, group: str) -> None:
        side = "canary" if group == "canary" else "stable"
        if client is None:
            self.keyless[side] += 1
            return
        self.keyed[side] += 1
        entry = self.clients.pop(client.id, None)
        if entry is None:
            entry = {
                "id": client.id,
                "bucket": int(client.bucket),
                # The group the key's bucket gives at this percent (sticky), for the panel.
                "expected": sticky_group(client.bucket, self.epoch[0])
                if self.config.sticky and self.epoch
                else None,
                "stable": 0,
                "canary": 0,
            }
            if len(self.clients) >= self.size:
                self.clients.popitem(last=False)
                self.forgotten += 1
        entry[side] += 1
        entry["last"] = round(time.time(), 3)
        self.clients[client.id] = entry

    def snapshot(self) -> dict[str, Any]:
        recent = list(reversed(self.clients.values()))
        flipped = [c for c in recent if c["stable"] and c["canary"]]
        steady = [c for c in recent if not (c["stable"] and c["canary"])]
        published = (flipped + steady)[:PUBLISHED_CLIENTS]
        return {
            "sticky": self.config.sticky,
            "header": self.config.header,
            "percent": self.epoch[0] if self.epoch else 0.0,
            "versions": dict(self.epoch[1]) if self.epoch else {},
            "since": round(self.since, 3),
            "keyed": dict(self.keyed),
            "keyless": dict(self.keyless),
            "tracked": len(self.clients),
            "flipped": len(flipped),
            "forgotten": self.forgotten,
            "clients": [dict(c) for c in published],
        }
