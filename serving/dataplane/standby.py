"""Fast recovery (seed 000 §3.3): a version replica keeps the last good weights it swapped out
in memory (the standby copy), so a rollback to them, or a reload back after a bad one, swaps
without reading the checkpoint from disk; and every hot reload has a deadline (seed 000 §1):
one that overruns fails cleanly, the weights in place keep serving.

With `standby_precision: same` (the default) the standby copy is the swapped-out model itself
(no copy is made; what it holds is measured and published as `bytes`). With `float16` it is a
copy whose weight matrices (nearly all the bytes) are float16, vectors (norms, RoPE frequencies)
kept as they are; a restore casts the matrices back to the engine's dtype in place (lossy by
float16's rounding, so a restored version's answers may differ slightly from a disk load's) and
drops the RoPE tables, which are rebuilt from the kept frequencies. A model already 16-bit is
kept as it is. `enabled=False` (the bench's baseline) keeps none.

Each failed hot reload (an error or an overrun deadline; the old weights kept serving) is kept
in `failures` (the last MAX_FAILURES) and published: the health tick alerts once per failure
(serving.ops.health.reloads)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections import deque
from collections.abc import Callable
from typing import Any

DEFAULT_DEADLINE_S = 60.0
PRECISIONS = ("same", "float16")
MAX_FAILURES = 5


class ReloadDeadline(TimeoutError):
    """A hot reload that did not finish within its deadline."""


def tensor_bytes(model: Any) -> int:
    """Bytes of the distinct tensors a model holds (tied weights count once)."""
    import torch

    seen: set[int] = set()
    total = 0

    def visit(value: Any, depth: int) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            key = value.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += value.untyped_storage().nbytes()
        elif depth < 3 and isinstance(value, list | tuple | dict):
            for item in value.values() if isinstance(value, dict) else value:
                visit(item, depth + 1)
        elif depth < 3 and hasattr(value, "__dict__"):
            for item in vars(value).values():
                visit(item, depth + 1)

    visit(model, 0)
    return total


def _cast(value: Any, dtype: Any, memo: dict[int, Any], depth: int = 0) -> Any:
    """`value` with its floating matrices cast to `dtype`: new containers and objects down to
    depth 3, tensors of another kind shared, tied tensors cast once (`memo`)."""
    import torch

    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.dim() < 2 or value.dtype == dtype:
            return value
        key = value.untyped_storage().data_ptr()
        if key not in memo:
            memo[key] = value.to(dtype)
        return memo[key]
    if depth >= 3:
        return value
    if isinstance(value, list | tuple):
        items = [_cast(item, dtype, memo, depth + 1) for item in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _cast(v, dtype, memo, depth + 1) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        changed = {}
        for name, item in vars(value).items():
            cast = _cast(item, dtype, memo, depth + 1)
            if cast is not item:
                changed[name] = cast
        if not changed:  # nothing cast below: shared as it is (a config, a device)
            return value
        out = copy.copy(value)
        vars(out).update(changed)
        return out
    return value


def low_precision(model: Any) -> tuple[Any, Any]:
    """(a float16 copy of `model`, the dtype to restore), or (model, None) when its weights
    are 16-bit already (a copy would save nothing)."""
    import torch

    dtype = getattr(model, "dtype", None)
    if dtype not in (torch.float32, torch.float64):
        return model, None
    return _cast(model, torch.float16, {}), dtype


def restore_precision(model: Any, dtype: Any) -> Any:
    """`model` (a float16 standby copy no one serves from) back in `dtype`."""
    import torch

    restored = _cast(model, dtype, {})
    restored.dtype = dtype
    if isinstance(getattr(restored, "cos", None), torch.Tensor):
        # Derived tables, cheap to rebuild from the kept frequencies (exactly, not rounded).
        hd = restored.cos.shape[1]
        restored.cos = torch.empty((0, hd), dtype=dtype, device=restored.cos.device)
        restored.sin = torch.empty((0, hd), dtype=dtype, device=restored.sin.device)
    return restored


class Standby:
    """The last good weights a replica swapped out, and its disk loads, restores and deadline
    failures (published with the replica's KV stats)."""

    def __init__(self, *, enabled: bool = True, precision: str = "same") -> None:
        self.enabled = enabled
        self.precision = precision  # the next copy's; the config's `standby_precision`
        self.held: tuple[Any, Any, Any] | None = None  # (model, tokenizer, chat)
        self.held_dtype: Any = None  # set: the held model is float16, restored to this dtype
        self.failures: deque[dict[str, Any]] = deque(maxlen=MAX_FAILURES)
        self.held_loaded: dict[str, Any] = {}
        self.bytes = 0
        self.disk_loads = 0
        self.restores = 0
        self.deadline_failures = 0
        self.last_source = ""
        self.last_failure: dict[str, Any] | None = None

    def keep(self, model: Any, tokenizer: Any, chat: Any, loaded: dict[str, Any]) -> None:
        """The weights being swapped out (they served well until now) become the standby."""
        if not self.enabled or model is None or not loaded.get("artifact"):
            return
        self.held_dtype = None
        if self.precision == "float16":
            # A copy: the model being swapped out still serves the requests running on it.
            model, self.held_dtype = low_precision(model)
        self.held, self.held_loaded = (model, tokenizer, chat), dict(loaded)
        self.bytes = tensor_bytes(model)

    def matches(self, config: dict[str, Any]) -> bool:
        want = str(config.get("fingerprint") or config.get("artifact"))
        held = self.held_loaded
        return (
            self.held is not None
            and held.get("artifact") == config.get("artifact")
            and held.get("fingerprint") == want
        )

    async def build(
        self,
        builder: Callable[[dict[str, Any]], tuple[Any, Any, Any]],
        config: dict[str, Any],
        *,
        hot: bool,
        forced: bool = False,
    ) -> tuple[Any, Any, Any]:
        """The weights `config` asks for: the standby copy when it holds them (not for a
        drill's forced reload, which must read from disk), else `builder` in a thread, within
        the deadline when weights are already serving (`hot`). A hot reload that fails is
        kept in `failures` and raised again."""
        precision = str(config.get("standby_precision") or "same")
        self.precision = precision if precision in PRECISIONS else "same"
        if hot and not forced and self.matches(config) and self.held is not None:
            self.restores += 1
            self.last_source = "standby"
            held = self.held
            if self.held_dtype is not None:
                model = await asyncio.to_thread(restore_precision, held[0], self.held_dtype)
                held = (model, held[1], held[2])
                # It serves now: the next swap keeps the outgoing weights instead.
                self.held, self.held_dtype, self.bytes = None, None, 0
            return held
        self.disk_loads += 1
        self.last_source = "disk"
        if not hot:  # the first load: nothing serves yet, Serve's own start-up timeout applies
            return await asyncio.to_thread(builder, config)
        deadline = float(config.get("reload_deadline_s") or DEFAULT_DEADLINE_S)
        started = time.time()
        try:
            return await asyncio.wait_for(asyncio.to_thread(builder, config), deadline)
        except TimeoutError:
            # The thread runs on and its result is dropped: the weights in place keep serving.
            self.deadline_failures += 1
            self.last_failure = {
                "artifact": config.get("artifact"),
                "version": config.get("version", ""),
                "deadline_s": deadline,
                "at": started,
            }
            self._failed(config, started, f"the reload overran its {deadline:g} s deadline")
            raise ReloadDeadline(f"the reload overran its {deadline:g} s deadline") from None
        except Exception as exc:
            self._failed(config, started, str(exc) or type(exc).__name__)
            raise

    def _failed(self, config: dict[str, Any], at: float, error: str) -> None:
        self.failures.append(
            {
                "artifact": str(config.get("artifact") or "")[:300],
                "version": str(config.get("version") or "")[:200],
                "error": error[:300],
                "at": at,
            }
        )

    def snapshot(self, reloads: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """What the replica publishes; with its reload history, the last failed reload (the
        portal shows it: old weights kept serving)."""
        failed = [r for r in reloads or () if not r.get("ok")]
        last = failed[-1] if failed else None
        return {
            "enabled": self.enabled,
            "precision": self.precision,
            "held_float16": self.held is not None and self.held_dtype is not None,
            "failures": list(self.failures),
            "version": self.held_loaded.get("version") if self.held is not None else None,
            "bytes": self.bytes if self.held is not None else 0,
            "disk_loads": self.disk_loads,
            "restores": self.restores,
            "deadline_failures": self.deadline_failures,
            "last_source": self.last_source,
            "last_deadline_failure": self.last_failure,
            "last_failed_reload": None
            if last is None
            else {
                "artifact": last.get("artifact"),
                "error": str(last.get("error"))[:300],
                "at": last.get("at"),
            },
        }
