"""Every name the portal gives a tenant's things in shared places: Serve application names,
route prefixes, and what is built from them (SLI keys in Redis, metric labels, GPU owners).

The names must be injective over every tenant slug, deployment name, pool name and slot,
whatever a tenant chooses: two deployments that compiled to one Serve application would make
Serve refuse the whole declarative config, and every tenant's change would stall. The scheme
cannot collide by construction:

* `.` is the reserved separator. No component may contain it (nor `/`, `:` or whitespace):
  tenant slugs are `[A-Za-z0-9_-]`, deployment and pool names `[a-z0-9-]`, so a name splits
  back into the components it was made of (`parse_app`).
* The kind is in the shape: a router is two components (`<slug>.<deployment>`), a version
  slot three ending in its slot (`<slug>.<deployment>.canary`, `.stable`), a platform
  application three ending in `pool` or `sampler` (`platform.<pool>.pool`,
  `platform.gpu-nodes.sampler`). No tenant slot is called `pool` or `sampler`, so no tenant's
  name can be a platform one.
* Route prefixes are `/<slug>/<deployment>`; `/` is in no component, and a component starts
  with a letter or digit, so no route lands on Serve's own `/-/` paths.

Django-free: the compiler, the health tick, the GPU agent and the drills all name through here.
"""

from __future__ import annotations

import re

SEP = "."
# A component: starts with a letter or digit; no separator, slash, colon or space anywhere.
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")
# Version slots served by an application of their own: the canary; and a vLLM stable slot
# (vLLM cannot hot-swap weights in the router's replica, serving.control.compile).
# The degraded tiers (serving.dataplane.tiers) are slots of their own too.
TENANT_SLOTS = ("canary", "stable", "distilled", "proxy")
PLATFORM = "platform"
POOL_ROLE = "pool"
SAMPLER_ROLE = "sampler"
GPU_NODES_APP = f"{PLATFORM}{SEP}gpu-nodes{SEP}{SAMPLER_ROLE}"


class BadName(ValueError):
    """A component the scheme cannot carry (it would make names ambiguous)."""

    def __init__(self, kind: str, value: str) -> None:
        self.kind, self.value = kind, value
        super().__init__(
            f"{kind} {value!r} cannot be used in a Serve name: use letters, digits, '-' and "
            "'_', starting with a letter or digit (at most 80 characters)"
        )


def _check(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _COMPONENT.fullmatch(value):
        raise BadName(kind, str(value))
    return value


def deployment_app(tenant_slug: str, deployment: str) -> str:
    """The router's application (a dedicated deployment's stable slot runs inside it); the
    name its replicas publish SLIs and GPU processes under, for every slot."""
    return f"{_check('tenant slug', tenant_slug)}{SEP}{_check('deployment name', deployment)}"


def slot_app(tenant_slug: str, deployment: str, slot: str) -> str:
    """A version slot served by its own application (the canary; a vLLM stable slot)."""
    if slot not in TENANT_SLOTS:
        raise BadName("slot", slot)
    return f"{deployment_app(tenant_slug, deployment)}{SEP}{slot}"


def pool_app(pool: str) -> str:
    return f"{PLATFORM}{SEP}{_check('pool name', pool)}{SEP}{POOL_ROLE}"


def route_prefix(tenant_slug: str, deployment: str) -> str:
    return f"/{_check('tenant slug', tenant_slug)}/{_check('deployment name', deployment)}"


def parse_app(name: str) -> tuple[str, ...]:
    """The inverse of the constructors: ("deployment", slug, name), ("slot", slug, name,
    slot), ("pool", pool) or ("sampler",). Raises BadName for a name the portal never makes."""
    parts = name.split(SEP)
    if len(parts) == 2 and all(_COMPONENT.fullmatch(p) for p in parts):
        return ("deployment", parts[0], parts[1])
    if len(parts) == 3 and all(_COMPONENT.fullmatch(p) for p in parts):
        if parts[2] in TENANT_SLOTS:
            return ("slot", parts[0], parts[1], parts[2])
        if parts[0] == PLATFORM and parts[2] == POOL_ROLE:
            return ("pool", parts[1])
        if name == GPU_NODES_APP:
            return ("sampler",)
    raise BadName("application name", name)


def is_portal_app(name: str) -> bool:
    """Is `name` an application the portal makes (parse_app accepts it)?"""
    try:
        parse_app(name)
    except BadName:
        return False
    return True
