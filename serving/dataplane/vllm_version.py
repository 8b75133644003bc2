"""A version slot served by vLLM (serving.engine.vllm.runtime): the built-in VersionCore with
its engine swapped for vLLM's. Keys, salts, faults, the guard, the chat template, stop
sequences, SLIs and the published KV snapshot are VersionCore's, unchanged.

vLLM cannot hot-swap weights in place. The compiler puts a vLLM slot's weights into its
replicas' init args (serving.control.compile), so a new version is new replicas: Serve starts
each replacement before it drains and stops the old one (`max_surge_percent`), and no request
fails. A reconfigure that names other weights on a running vLLM replica (it cannot happen
through the compiler) is refused and recorded, the loaded weights keep serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from typing import Any

from ray import serve

from serving.dataplane.fetch import local_artifact
from serving.dataplane.version import VersionCore

logger = logging.getLogger("ray.serve")


class VllmCore(VersionCore):
    """VersionCore on vLLM's async engine."""

    async def _load(self, config: dict[str, Any], forced: tuple[Any, ...] | None = None) -> None:
        started = time.time()
        if self.engine is not None:
            self.reloads.append(
                {
                    "artifact": config["artifact"],
                    "ok": False,
                    "error": "vLLM cannot hot-swap weights: a new version comes as new replicas",
                    "at": started,
                }
            )
            del self.reloads[:-50]
            return
        from serving.engine import chat
        from serving.engine.checkpoint import load_tokenizer
        from serving.engine.vllm.runtime import VllmEngine

        path, fetched = await asyncio.to_thread(local_artifact, config)
        tokenizer = await asyncio.to_thread(load_tokenizer, path)
        template = await asyncio.to_thread(chat.load, path)
        # Built on the replica's event loop: AsyncLLM binds its output handler to it.
        self.engine = VllmEngine(path, self.engine_options)
        self.tokenizer, self.chat = tokenizer, template
        self.loaded = {
            "artifact": config["artifact"],
            "version": config.get("version", ""),
            "fingerprint": config.get("fingerprint") or config["artifact"],
            "engine": "vllm",
        }
        self.recorder.version = str(config.get("version", ""))
        self.reloads.append(
            {
                "artifact": config["artifact"],
                "ok": True,
                "at": started,
                "s": _since(started),
                "fetch": fetched,
            }
        )
        self.fetched = fetched
        logger.info("vLLM loaded %s in %.1f s", path, time.time() - started)

    def _submit(
        self,
        prompt_ids: list[int],
        params: Any,
        tenant: str,
        rid: str,
        salt: bytes,
        **kw: Any,
    ) -> Any:
        """A tenant whose prefix caching is off (its `kv_cache`; in a shared vLLM pool, where
        vLLM's switch is the whole engine's) gets a salt of its own per request: vLLM then
        never matches one of its blocks across requests, without restarting anything."""
        if not self.kv_checks.policy(tenant).prefix_caching:
            salt = hashlib.sha256(salt + os.urandom(16)).digest()
        return super()._submit(prompt_ids, params, tenant, rid, salt, **kw)

    def _forget_departed_probes(self) -> None:
        """vLLM holds no per-tenant blocks: a departed tenant leaves only its counters."""
        if self.engine is None:
            return
        for tenant in sorted(self._departed):
            self.engine.drop_tenant(tenant)
        self._departed.clear()

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "engine": "vllm"}

    def __del__(self) -> None:
        """Serve calls this when it stops the replica: it says so (VersionCore) and vLLM's
        processes go with it."""
        try:
            super().__del__()
        finally:
            engine = getattr(self, "engine", None)
            if engine is not None:
                engine.shutdown()


@serve.deployment(name="version")
class VllmServer(VllmCore):
    """A vLLM version slot as its own Serve deployment (a canary, a shared pool)."""


def _since(started: float) -> float:
    return round(time.time() - started, 4)
