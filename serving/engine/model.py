"""Llama forward pass (RMSNorm, RoPE, SwiGLU, grouped-query attention) over a paged KV cache.

Weights are fused at load (q/k/v into one matrix, gate/up into one) so a decode step costs
few kernel launches; the maths follows Hugging Face's LlamaForCausalLM in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from serving.engine.config import LlamaConfig

ROPE_MIN_POSITIONS = 4096  # first RoPE table length (grown by doubling when passed)


@dataclass(frozen=True)
class Segment:
    """New tokens of one sequence in a forward pass: they sit at positions start_pos.. and the
    sequence's KV lives in the blocks of `block_table`."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    last_index: torch.Tensor  # [S] index in T of each segment's last token
    # decode segments (one new token each), attended together
    decode_rows: torch.Tensor  # [D] rows in T
    decode_tables: torch.Tensor  # [D, Bmax] block ids of each context (padded)
    decode_mask: torch.Tensor  # [D, 1, 1, Bmax * block_size] additive
    # prefill segments, attended one by one: (rows slice, context blocks, causal mask)
    prefills: list[tuple[slice, torch.Tensor, torch.Tensor]]
    positions_end: int = 0  # one past the highest position in `positions` (sizes RoPE tables)


def _padded_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long).to(device)


def _additive_mask(allowed: torch.Tensor) -> torch.Tensor:
    """0 where attention is allowed, -inf elsewhere (built once per pass, not per layer)."""
    mask = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device)
    return mask.masked_fill_(~allowed, float("-inf"))


def build_batch(segments: list[Segment], block_size: int, device: torch.device) -> ForwardBatch:
    ids: list[int] = []
    positions: list[int] = []
    positions_end = 0
    slot_mapping: list[int] = []
    last: list[int] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lengths: list[int] = []
    prefills: list[tuple[slice, torch.Tensor, torch.Tensor]] = []
    for seg in segments:
        n = len(seg.token_ids)
        row = len(ids)
        end = seg.start_pos + n
        positions_end = max(positions_end, end)
        ids.extend(seg.token_ids)
        positions.extend(range(seg.start_pos, end))
        table = seg.block_table
        slot_mapping.extend(
            table[p // block_size] * block_size + p % block_size for p in range(seg.start_pos, end)
        )
        last.append(row + n - 1)
        used = -(-end // block_size)
        if n == 1:
            decode_rows.append(row)
            decode_tables.append(table[:used])
            decode_lengths.append(end)
        else:
            blocks = _padded_tables([table[:used]], device)[0]
            q_pos = torch.arange(seg.start_pos, end, device=device)
            k_pos = torch.arange(used * block_size, device=device)
            mask = _additive_mask(k_pos[None, :] <= q_pos[:, None])
            prefills.append((slice(row, row + n), blocks, mask))

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    if decode_tables:
        tables = _padded_tables(decode_tables, device)
        width = tables.shape[1] * block_size
        lengths = torch.tensor(decode_lengths, dtype=torch.long, device=device)
        allowed = torch.arange(width, device=device)[None, :] < lengths[:, None]
        decode_mask = _additive_mask(allowed)
    else:
        tables = torch.zeros((0, 0), dtype=torch.long, device=device)
        decode_mask = torch.zeros((0, 0), dtype=torch.float32, device=device)
    return ForwardBatch(
        token_ids=t(ids),
        positions=t(positions),
        slot_mapping=t(slot_mapping),
        last_index=t(last),
        decode_rows=t(decode_rows),
        decode_tables=tables,
        decode_mask=decode_mask[:, None, None, :],
        prefills=prefills,
        positions_end=positions_end,
    )


class KVCache:
    """K and V of every layer, as `num_blocks * block_size` slots of [kv_heads, head_dim]."""

    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks * block_size, config.num_key_value_heads, config.head_dim)
        self.k = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.v = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]

    @property
    def bytes_per_block(self) -> int:
        k = self.k[0]
        return 2 * len(self.k) * self.block_size * k.shape[1] * k.shape[2] * k.element_size()


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaModel:
    def __init__(
        self,
        config: LlamaConfig,
        tensors: dict[str, torch.Tensor],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        fingerprint: str = "",
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.fingerprint = fingerprint

        def w(name: str) -> torch.Tensor:
            return tensors[name].to(device=self.device, dtype=dtype)

        self.embed = w("model.embed_tokens.weight")
        self.layers = []
        for n in range(config.num_hidden_layers):
            p = f"model.layers.{n}."
            self.layers.append(
                _Layer(
                    ln1=w(p + "input_layernorm.weight"),
                    qkv=torch.cat(
                        [w(p + f"self_attn.{x}_proj.weight") for x in ("q", "k", "v")]
                    ).contiguous(),
                    o=w(p + "self_attn.o_proj.weight"),
                    ln2=w(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat(
                        [w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]
                    ).contiguous(),
                    down=w(p + "mlp.down_proj.weight"),
                )
            )
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed if config.tie_word_embeddings else w("lm_head.weight")
        hd = config.head_dim
        self._inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        )
        # RoPE tables grow with the longest position seen (doubling, up to the configured
        # maximum), never sized by max_position_embeddings up front: a config may claim
        # millions of positions that no request will ever reach.
        self.cos = torch.empty((0, hd), dtype=dtype, device=self.device)
        self.sin = torch.empty((0, hd), dtype=dtype, device=self.device)
        self.q_size = config.num_attention_heads * hd
        self.kv_size = config.num_key_value_heads * hd
        self.eps = config.rms_norm_eps

    def _rope_upto(self, positions_end: int) -> None:
        """Make the RoPE tables cover positions [0, positions_end)."""
        have = self.cos.shape[0]
        if positions_end <= have:
            return
        limit = self.config.max_position_embeddings
        if positions_end > limit:
            raise ValueError(
                f"position {positions_end - 1} is beyond max_position_embeddings ({limit})"
            )
        length = min(limit, max(positions_end, 2 * have, ROPE_MIN_POSITIONS))
        pos = torch.arange(length, dtype=torch.float32)
        freqs = torch.outer(pos, self._inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(self.device, self.dtype)
        self.sin = emb.sin().to(self.device, self.dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(x.dtype)

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, cache: KVCache, *, all_logits: bool = False
    ) -> torch.Tensor:
        """Logits [S, vocab] for each segment's last token (or [T, vocab] with all_logits)."""
        cfg = self.config
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        x = self.embed.index_select(0, batch.token_ids)
        n_tokens = x.shape[0]
        # once per pass, shared by every layer
        self._rope_upto(batch.positions_end)
        cos = self.cos.index_select(0, batch.positions)[:, None, :]
        sin = self.sin.index_select(0, batch.positions)[:, None, :]
        bs = cache.block_size
        pure_decode = not batch.prefills  # every segment is one token: rows are in order
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.ln1)
            qkv = h @ layer.qkv.T
            qk = qkv[:, : self.q_size + self.kv_size].view(n_tokens, nh + nkv, hd)
            qk = qk * cos + _rotate_half(qk) * sin  # RoPE on q and k in one go
            q, k = qk[:, :nh], qk[:, nh:]
            v = qkv[:, self.q_size + self.kv_size :].view(n_tokens, nkv, hd)
            kc, vc = cache.k[i], cache.v[i]
            kc[batch.slot_mapping] = k
            vc[batch.slot_mapping] = v
            kb = kc.view(-1, bs, nkv, hd)  # gather whole blocks: few indices, long copies
            vb = vc.view(-1, bs, nkv, hd)
            out = q if pure_decode else torch.empty_like(q)
            if batch.decode_rows.numel():
                qd = (q if pure_decode else q[batch.decode_rows])[:, :, None, :]  # [D,nh,1,hd]
                n_dec = batch.decode_tables.shape[0]
                flat = batch.decode_tables.view(-1)  # index_select: ~2x advanced indexing
                kd = kb.index_select(0, flat).view(n_dec, -1, nkv, hd).transpose(1, 2)
                vd = vb.index_select(0, flat).view(n_dec, -1, nkv, hd).transpose(1, 2)
                od = F.scaled_dot_product_attention(
                    qd, kd, vd, attn_mask=batch.decode_mask, enable_gqa=nkv != nh
                )
                if pure_decode:
                    out = od[:, :, 0, :]
                else:
                    out[batch.decode_rows] = od[:, :, 0, :]
            for rows, blocks, mask in batch.prefills:
                qp = q[rows].transpose(0, 1)[None]  # [1, nh, n, hd]
                kp = kb.index_select(0, blocks).view(-1, nkv, hd).transpose(0, 1)[None]
                vp = vb.index_select(0, blocks).view(-1, nkv, hd).transpose(0, 1)[None]
                op = F.scaled_dot_product_attention(
                    qp, kp, vp, attn_mask=mask, enable_gqa=nkv != nh
                )
                out[rows] = op[0].transpose(0, 1)
            x = x + out.reshape(n_tokens, self.q_size) @ layer.o.T
            h = self._norm(x, layer.ln2)
            gu = h @ layer.gate_up.T
            inter = gu.shape[-1] // 2
            x = x + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ layer.down.T
        if not all_logits:
            x = x[batch.last_index]
        return (self._norm(x, self.norm) @ self.lm_head.T).float()

    def reference_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits for every position of one sequence, through a throwaway cache."""
        n = int(token_ids.numel())
        block = 16
        blocks = (n + block - 1) // block
        cache = KVCache(self.config, blocks, block, dtype=self.dtype, device=self.device)
        seg = Segment(token_ids.tolist(), 0, list(range(blocks)))
        return self.forward(build_batch([seg], block, self.device), cache, all_logits=True)
