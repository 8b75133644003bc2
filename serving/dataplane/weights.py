"""How a version slot's weights arrive: loaded and validated beside the old ones, then swapped
atomically (a hot reload within its deadline, or the standby copy), with the reload history a
drill and the health page read. Mixed into VersionCore (serving.dataplane.version)."""

from __future__ import annotations

import logging
import time
from typing import Any

from serving.dataplane.sli import SliRecorder
from serving.dataplane.standby import Standby

logger = logging.getLogger("ray.serve")


class WeightLoading:
    """The loading half of a version slot: `_load` swaps in new weights, `_build_model` reads
    them (what the artifact fetch put on this node)."""

    engine: Any
    engine_options: dict[str, Any]
    tokenizer: Any
    chat: Any
    loaded: dict[str, Any]
    reloads: list[dict[str, Any]]
    fetched: dict[str, Any]
    standby: Standby
    recorder: SliRecorder

    async def _load(self, config: dict[str, Any], forced: tuple[Any, ...] | None = None) -> None:
        """Load and validate the new weights beside the old ones, then swap atomically.
        `forced`: a drill's reload of the same artifact (weight_swap_jitter's reload key)."""
        started = time.time()
        drill = {"drill": forced[0], "nonce": forced[2]} if forced else {}
        try:
            hot = self.engine is not None  # a hot reload: within its deadline, or standby
            model, tokenizer, chat = await self.standby.build(
                self._build_model, config, hot=hot, forced=forced is not None
            )
        except Exception as exc:
            self.reloads.append(
                {
                    "artifact": config["artifact"],
                    "ok": False,
                    "error": str(exc),
                    "at": started,
                    **drill,
                }
            )
            if len(self.reloads) > 100:
                del self.reloads[:-50]
            if self.engine is None:
                raise  # nothing to fall back on: the replica cannot serve
            logger.error(
                "hot reload of %s failed, old weights keep serving: %s", config["artifact"], exc
            )
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
            self.standby.keep(self.engine.engine.model, self.tokenizer, self.chat, self.loaded)
            self.engine.swap_model(model)
        self.tokenizer, self.chat = tokenizer, chat
        self.loaded = {
            "artifact": config["artifact"],
            "version": config.get("version", ""),
            "fingerprint": model.fingerprint,
        }
        self.recorder.version = str(config.get("version", ""))
        self.reloads.append(
            {
                "artifact": config["artifact"],
                "ok": True,
                "at": started,
                "s": round(time.time() - started, 4),
                "fetch": self.fetched,
                "from": self.standby.last_source,
                **drill,
            }
        )
        if len(self.reloads) > 100:  # a drill reloads many times: keep the recent history
            del self.reloads[:-50]

    def _build_model(self, config: dict[str, Any]) -> tuple[Any, Any, Any]:
        from serving.dataplane.fetch import local_artifact
        from serving.engine.checkpoint import load_for_serving

        directory, self.fetched = local_artifact(config)
        return load_for_serving(
            directory,
            gpu=bool(self.engine_options.get("gpu")),
            fingerprint=config.get("fingerprint") or config["artifact"],
        )
