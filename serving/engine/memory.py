"""The GPU memory of one engine replica: what a request needs (its KV blocks, the activations of
the batch it joins), what a tenant may hold (its GPU memory cap per replica), what is free (the
CUDA caching allocator and the driver), and the admission check that refuses a request that
cannot fit with a clear error instead of an out-of-memory crash mid-batch.

Sizes are estimates from the model's shapes (float32 unless the model says otherwise):

- a KV block: K and V of every layer for `block_size` tokens;
- weights: the parameter count times the element size;
- activations of one forward pass over T tokens of S sequences: one layer's intermediates at a
  time (residual, norm, q/k/v with RoPE, attention output, MLP gate/up and its product), the
  attention of each prefill (scores and gathered K/V) and of each decode, and the float32
  logits of each sequence's last token. The largest single tensor of them must also fit in one
  free block (device-memory fragmentation: serving.telemetry.providers.fragmentation).

Django-free: the deployment checks (serving.deployments.services.spec) size a replica with
`replica_bytes` from the same numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

MIB = 1 << 20
CAP_FIELD = "max_gpu_memory_mb_per_replica"  # the Quota field that sets a tenant's cap
T = TypeVar("T")


class MemoryRefused(Exception):
    """A request the engine will not admit for memory; `status` and `code` are the client's
    answer (serving.dataplane.engine_calls): 413 when it can never fit under the tenant's cap,
    503 when the device cannot hold its batch now (retry later)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Shapes:
    """What memory depends on, from a model config (LlamaConfig or its registry summary)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    parameters: int
    dtype_bytes: int = 4
    context: int = 0  # max_position_embeddings: no step is longer (0: unknown)

    @classmethod
    def of(cls, config: Any, dtype_bytes: int = 4) -> Shapes:
        """From a LlamaConfig (attributes) or a version's config summary (a dict)."""

        def get(name: str) -> int:
            value = config.get(name) if isinstance(config, Mapping) else getattr(config, name)
            return int(value or 0)

        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        head_dim = get("head_dim") or (hidden // heads if heads else 0)
        parameters = (
            get("parameters") if isinstance(config, Mapping) else int(config.parameter_count())
        )
        return cls(
            layers=get("num_hidden_layers"),
            hidden=hidden,
            intermediate=get("intermediate_size"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=head_dim,
            vocab=get("vocab_size"),
            parameters=parameters,
            dtype_bytes=dtype_bytes,
            context=get("max_position_embeddings"),
        )

    @property
    def known(self) -> bool:
        return min(self.layers, self.hidden, self.heads, self.head_dim) > 0

    def longest(self, tokens: int) -> int:
        """`tokens`, but never more than the model's context."""
        return min(tokens, self.context) if self.context else tokens

    def block_bytes(self, block_size: int) -> int:
        return 2 * self.layers * block_size * self.kv_heads * self.head_dim * self.dtype_bytes

    def weight_bytes(self) -> int:
        return self.parameters * self.dtype_bytes

    def activations(
        self, prefills: Iterable[tuple[int, int]] = (), decode_contexts: Iterable[int] = ()
    ) -> tuple[int, int]:
        """(total bytes, largest single tensor) of one forward pass: `prefills` as (new
        tokens, context incl. them) per sequence, one token for each decode context."""
        prefills, decodes = list(prefills), list(decode_contexts)
        tokens = sum(n for n, _ in prefills) + len(decodes)
        sequences = len(prefills) + len(decodes)
        if not sequences:
            return 0, 0
        d, f32 = self.dtype_bytes, 4
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_token = 4 * self.hidden + 3 * q + 4 * kv + 3 * self.intermediate
        layer = d * tokens * per_token
        largest = d * tokens * 2 * self.intermediate  # the fused gate/up product
        attention = 0
        for new, context in prefills:
            scores = f32 * (self.heads + 1) * new * context  # scores and the mask
            attention += scores + d * 2 * context * kv
            largest = max(largest, f32 * self.heads * new * context)
        if decodes:
            longest = max(decodes)
            attention += f32 * (self.heads + 1) * len(decodes) * longest
            attention += d * 2 * len(decodes) * longest * kv
        logits = f32 * sequences * (self.vocab + self.hidden)
        largest = max(largest, f32 * sequences * self.vocab)
        return layer + attention + logits, largest


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def replica_bytes(
    shapes: Shapes,
    *,
    kv_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_prefill_tokens: int = 4096,
) -> dict[str, int]:
    """What one built-in engine replica holds: weights, its whole KV cache (allocated up front)
    and the activations of its largest step (a full prefill budget beside a full batch)."""
    step = shapes.longest(max_prefill_tokens)
    activations, _ = shapes.activations([(step, step)], [step] * max(0, max_num_seqs - 1))
    weights = shapes.weight_bytes()
    kv = kv_blocks * shapes.block_bytes(block_size)
    return {
        "weights": weights,
        "kv_cache": kv,
        "activations": activations,
        "total": weights + kv + activations,
    }


def mib(size: int) -> str:
    return f"{math.ceil(size / MIB):,} MiB"


# --- what the device says is free ------------------------------------------------------------


def free_blocks_of_segments(segments: Iterable[Mapping[str, Any]]) -> list[int]:
    """Sizes of the free (`inactive`) blocks of torch.cuda.memory_snapshot()'s segments; a
    run of adjacent inactive blocks is one free range (the allocator merges them on free, but
    a snapshot taken mid-way may list them apart)."""
    sizes: list[int] = []
    for segment in segments:
        run = 0
        for block in segment.get("blocks") or []:
            if block.get("state") == "inactive":
                run += int(block.get("size", 0))
            else:
                if run:
                    sizes.append(run)
                run = 0
        if run:
            sizes.append(run)
    return sizes


def allocator_report(device: Any) -> dict[str, Any] | None:
    """The CUDA caching allocator of this process on `device` (None off CUDA): bytes reserved
    and allocated, the free (`inactive`) bytes inside its segments and the largest such block,
    and the driver's free memory outside every allocator (torch.cuda.mem_get_info)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    snapshot = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call]
    segments = [s for s in snapshot if s.get("device") == index]
    blocks = free_blocks_of_segments(segments)
    driver_free, total = torch.cuda.mem_get_info(index)
    return {
        "device": index,
        "uuid": str(getattr(torch.cuda.get_device_properties(index), "uuid", "")),
        "reserved": int(torch.cuda.memory_reserved(index)),
        "allocated": int(torch.cuda.memory_allocated(index)),
        "inactive": sum(blocks),
        "largest_inactive": max(blocks, default=0),
        "driver_free": int(driver_free),
        "total": int(total),
        "source": "cuda_caching_allocator",
    }


def device_free(device: Any) -> tuple[int, int] | None:
    """(free bytes, largest free block) this process can allocate on `device` now: the
    driver's free memory plus the allocator's inactive blocks; None off CUDA."""
    report = allocator_report(device)
    if report is None:
        return None
    free = report["driver_free"] + report["inactive"]
    return free, max(report["driver_free"], report["largest_inactive"])


# The allocator's snapshot walks every segment: a burst of admissions shares one reading.
FREE_READ_S = 0.1


def _every(seconds: float, read: Callable[[], T]) -> Callable[[], T]:
    """`read`, called at most once every `seconds`; the last value in between."""
    last: list[Any] = [float("-inf"), None]

    def call() -> T:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0], last[1] = now, read()
        return cast(T, last[1])

    return call


# --- the engine's guard ------------------------------------------------------------------------


@dataclass
class MemoryGuard:
    """One engine's memory plan and its tenants' caps (bytes per replica). A tenant with a cap
    pays for the weights where the replica is its own (`charge_weights`; a shared pool's
    weights are the platform's), its KV blocks and the activations of its requests; the KV
    part is enforced at every allocation through the block pool's quota (`cap_blocks`, which
    the async engine applies), the rest at admission (`check`)."""

    shapes: Shapes
    block_size: int
    num_blocks: int
    max_prefill_tokens: int = 4096
    device: Any = "cpu"
    caps: dict[str, int] = field(default_factory=dict)
    charge_weights: bool = True
    # What is free on the device now, (free, largest block); None: not a GPU (no check).
    free_memory: Callable[[], tuple[int, int] | None] | None = None

    def __post_init__(self) -> None:
        if self.free_memory is None:
            self.free_memory = _every(FREE_READ_S, lambda: device_free(self.device))

    @property
    def block_bytes(self) -> int:
        return self.shapes.block_bytes(self.block_size)

    def step_reserve(self) -> int:
        """Activations a tenant's requests may take in one step: a full prefill budget."""
        step = self.shapes.longest(self.max_prefill_tokens)
        return self.shapes.activations([(step, step)])[0]

    def set_caps(self, caps_mb: Mapping[str, int | None], *, charge_weights: bool) -> None:
        """Each tenant's cap in MiB (None or absent: none); `charge_weights`: the replica is
        the tenant's own (dedicated), so its weights count against the cap."""
        self.caps = {t: int(mb) * MIB for t, mb in caps_mb.items() if mb is not None}
        self.charge_weights = charge_weights

    def cap_blocks(self, tenant: str) -> int | None:
        """The KV blocks `tenant` may hold under its cap (None: no cap), after the weights it
        pays for and the activations of a step."""
        cap = self.caps.get(tenant)
        if cap is None:
            return None
        fixed = self.shapes.weight_bytes() if self.charge_weights else 0
        room = cap - fixed - self.step_reserve()
        return max(0, min(self.num_blocks, room // max(1, self.block_bytes)))

    def check(
        self, tenant: str, prompt_tokens: int, max_tokens: int, running: Iterable[int] = ()
    ) -> None:
        """Refuse (MemoryRefused) a request that cannot fit: more KV blocks than the tenant's
        cap leaves room for (413), or a batch with it (beside the `running` sequences, by
        their lengths) whose activations the device cannot hold now (503). More KV blocks than
        the tenant's block quota is the engine's own check (EngineFull, 429)."""
        need = blocks_for(prompt_tokens + max_tokens, self.block_size)
        kv = need * self.block_bytes
        cap_blocks = self.cap_blocks(tenant)
        # Only when the cap binds: a request larger than the whole pool is the block quota's
        # refusal (429 kv_quota_exceeded), as without a cap.
        if cap_blocks is not None and cap_blocks < self.num_blocks and need > cap_blocks:
            fixed = self.shapes.weight_bytes() if self.charge_weights else 0
            weights = f"the weights' {mib(fixed)} and " if fixed else ""
            raise MemoryRefused(
                413,
                "gpu_memory_cap_exceeded",
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) needs {need} KV "
                f"blocks ({mib(kv)}); the tenant's GPU memory cap of {mib(self.caps[tenant])} "
                f"per replica ({CAP_FIELD}) leaves room for {cap_blocks} after {weights}"
                f"{mib(self.step_reserve())} for a step's activations",
            )
        free = self.free_memory() if self.free_memory is not None else None
        if free is None:
            return
        total, largest_tensor = self.shapes.activations(
            [(prompt_tokens, prompt_tokens)], list(running)
        )
        free_bytes, largest_block = free
        if total > free_bytes or largest_tensor > largest_block:
            raise MemoryRefused(
                503,
                "insufficient_gpu_memory",
                f"the batch with this request needs {mib(total)} of activations (largest "
                f"tensor {mib(largest_tensor)}); the GPU has {mib(free_bytes)} free, largest "
                f"free block {mib(largest_block)}: retry later or send a shorter prompt",
            )


def engine_shapes(model: Any) -> Shapes:
    """The shapes of a loaded LlamaModel, at its dtype."""
    import torch

    return Shapes.of(model.config, torch.empty((), dtype=model.dtype).element_size())


def memory_caps(engine: Any, caps_mb: Mapping[str, int | None], *, shared: bool) -> None:
    """Tell an Engine its tenants' caps (MiB per replica; in a shared pool the weights are the
    platform's) and hold each capped tenant's KV blocks under its cap: its block quota becomes
    the lower of what it was and what the cap leaves. Call after the quotas are set."""
    engine.memory.set_caps(caps_mb, charge_weights=not shared)
    pool = engine.pool
    for tenant in engine.memory.caps:
        blocks = engine.memory.cap_blocks(tenant)
        if blocks is not None:
            pool.quotas[tenant] = min(pool.quota(tenant), blocks)
