"""A tiny Llama trained on the fly to answer in readable English (the demo's model).

`write_tiny_checkpoint` (serving.engine.testing) writes random weights: fine for checking the
engine's maths, but its answers are random bytes. `train_tiny_llama` instead trains a small
Llama for a few seconds on CPU, in plain torch, until it has learnt a fixed English text of
short sentences about what the portal does (deployments, canaries, SLA contracts, rollbacks,
drills, incidents). The checkpoint has the layout and parameter names of
`write_tiny_checkpoint` (config.json, model.safetensors, tokenizer.json); the training forward
below does exactly the maths of serving.engine.model.LlamaModel (RMSNorm, RoPE with
rotate-half, grouped-query attention, SiLU-gated MLP), so the engine serves what was trained.

A prompt that starts one of the sentences (its first two words suffice) is continued greedily
with the rest of it, then the end-of-sequence token. Each sentence is one training sequence
from position 0 with no BOS token, as the data plane encodes prompts; each also follows 1-4
random words, so any other prompt ("Hello", "What is a canary?") is mostly
answered with some sentence of the text rather than with bytes.

Versions: `variant=1` learns the plain sentences, `variant=2` a friendlier wording of the same
ones (each pair starts with the same words, so one prompt gets a different answer from v1 and
v2). Both variants share one tokenizer (trained on both texts) and one config, so v1 and v2 of
the demo model are hot-swappable; `seed` changes the weights, not the text. `corpus`
(one sentence a line) replaces the built-in text and the tokenizer's. Training (one thread,
one full batch a step: about 75 steps, 5-10 s on a two-core machine) stops on its loss target,
so a seed gives the same weights on every run on one machine; only when `seconds` runs out
first (`TrainResult.converged` false, a very busy machine) does the result depend on speed.

    python -m serving.engine.tiny_trained OUT_DIR [--seconds S] [--seed N] [--variant 1|2]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from serving.engine.checkpoint import expected_shapes
from serving.engine.config import LlamaConfig, parse_config
from serving.engine.testing import TINY_CONFIG, build_tokenizer

# Sentence i of FRIENDLY rewords sentence i of PLAIN and starts with the same words; within one
# list, no two sentences share their first two words, so such a prompt names one sentence.
PLAIN = [
    "Deployments roll a new model version out to the fleet step by step.",
    "A canary takes a small share of live traffic before the full rollout.",
    "If the canary stays healthy, the portal promotes it to every replica.",
    "When error rates climb, the portal rolls the canary back on its own.",
    "Rollbacks return traffic to the last version that met its targets.",
    "An SLA contract sets the latency and availability a tenant can expect.",
    "Contracts at risk open an incident and page the owner.",
    "Incidents keep a timeline of alerts, actions and notes in one place.",
    "Drills inject faults on purpose so the team can practise the response.",
    "Each drill ends with a short report on what worked and what to fix.",
    "Every tenant has its own keys, quotas and usage dashboard.",
    "The model registry checks each checkpoint before it can be deployed.",
    "Validation reads the config, the weights and the tokenizer, then runs a test pass.",
    "Error budgets show how much downtime is left this month.",
    "Dashboards plot latency, throughput and errors for every deployment.",
    "Alerts go to the engineer on call by email or chat.",
    "Hot swaps load new weights without dropping requests in flight.",
    "Quotas count each request against the tenant that sent it.",
    "Prefix caching reuses work for prompts that start the same way.",
    "The scheduler shares the batch fairly between tenants.",
    "Root cause hints point at the change that most likely broke things.",
    "Postmortems record what happened, why, and how to prevent it.",
    "Rollouts pause on their own when the analysis finds a regression.",
    "Operators can approve, pause or abort a rollout from the console.",
    "The audit log records every change to a deployment.",
    "Health checks probe each replica every few seconds.",
    "Unhealthy replicas are drained and replaced.",
    "Traffic shifts in small steps: five percent, then twenty, then all.",
    "Breaches of a contract are recorded with their start and end time.",
    "Tenants can read their own usage but never the data of another tenant.",
    "Status pages tell customers when a service is degraded.",
    "Good runbooks make incidents shorter and calmer.",
    "Hello! This portal deploys, watches and heals your models.",
]
FRIENDLY = [
    "Deployments move your new model version out gently, one small step at a time.",
    "A canary is a careful first look: a few users try the new version first.",
    "If the canary stays happy, we promote it to every replica for you.",
    "When error rates climb, we roll the canary back for you right away.",
    "Rollbacks bring your traffic home to the last version that worked well.",
    "An SLA contract is our promise about latency and availability to you.",
    "Contracts at risk open an incident, and we page the owner so nothing is missed.",
    "Incidents keep the whole story of alerts, actions and notes in one friendly place.",
    "Drills break things on purpose, safely, so the team can practise together.",
    "Each drill ends with a kind little report on what went well and what to improve.",
    "Every tenant gets their own keys, quotas and a tidy usage dashboard.",
    "The model registry looks over each checkpoint carefully before it goes live.",
    "Validation reads the config, the weights and the tokenizer, then tries a test pass.",
    "Error budgets tell you how much room for mistakes is left this month.",
    "Dashboards draw latency, throughput and errors so you can see how things are going.",
    "Alerts reach the friendly engineer on call by email or chat.",
    "Hot swaps change the weights quietly, and no request in flight is dropped.",
    "Quotas keep things fair by counting each request for the tenant that sent it.",
    "Prefix caching saves time when prompts start the same way.",
    "The scheduler makes sure every tenant gets a fair share of the batch.",
    "Root cause hints gently point at the change that most likely caused trouble.",
    "Postmortems are blameless notes on what happened and how we will do better.",
    "Rollouts take a short break when the analysis spots a regression.",
    "Operators can approve, pause or stop a rollout with one click in the console.",
    "The audit log remembers every change to a deployment, so nothing is lost.",
    "Health checks say hello to each replica every few seconds.",
    "Unhealthy replicas get a rest and a fresh replacement.",
    "Traffic moves over slowly: five percent, then twenty, then everyone.",
    "Breaches of a contract are written down with their start and end time.",
    "Tenants can always see their own usage, and their data stays private.",
    "Status pages let customers know quickly when a service is slow.",
    "Good runbooks make incidents shorter, calmer and less scary.",
    "Hello! I am the portal, and I am happy to help with your models.",
]
# Words a visitor may type that the text lacks: training puts a few random words (these and
# the text's own) before a sentence, so any prompt is answered with some whole sentence.
_NOISE_WORDS = [
    *("what", "how", "why", "who", "is", "are", "do", "does", "can", "you"),
    *("tell", "me", "about", "the", "a", "please", "hi", "ok"),
]

VOCAB_SIZE = 512
# The random tiny checkpoint's architecture, a little wider, its embeddings tied.
TRAINED_CONFIG: dict[str, Any] = {
    **TINY_CONFIG,
    "hidden_size": 96,
    "intermediate_size": 256,
    "tie_word_embeddings": True,
    "vocab_size": VOCAB_SIZE,
}
EOS_ID = 2
IGNORE = -100
LR = 6e-3
WARMUP_STEPS = 10


def corpus_sentences(variant: int = 1) -> list[str]:
    """The built-in sentences of `variant` (1: plain, 2: friendly)."""
    if variant not in (1, 2):
        raise ValueError(f"variant must be 1 or 2, got {variant}")
    return list(PLAIN if variant == 1 else FRIENDLY)


def corpus_words(sentences: list[str] | None = None) -> set[str]:
    """Every word of `sentences` (default: both built-in variants), lower-case, without
    punctuation."""
    text = PLAIN + FRIENDLY if sentences is None else sentences
    return {_bare(word) for sentence in text for word in sentence.split()} - {""}


def _bare(word: str) -> str:
    return word.strip(".,:;!?'\"").lower()


@dataclass
class TrainResult:
    directory: Path
    steps: int
    loss: float  # the last step's mean loss over every learnt token
    sentence_loss: float  # the stopping loss: the sentences alone, from their third token
    converged: bool  # stopped on `target_loss`, not on time or `max_steps`
    seconds: float
    size_bytes: int


def training_forward(
    config: LlamaConfig, params: dict[str, torch.Tensor], ids: torch.Tensor
) -> torch.Tensor:
    """Logits [B, T, vocab] for a right-padded batch [B, T] from position 0 (causal attention,
    so the padding after a sequence never reaches it); the maths of LlamaModel.forward."""
    hd, nh, nkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    eps = config.rms_norm_eps
    batch, length = ids.shape
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    emb = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq).repeat(1, 2)
    cos, sin = emb.cos(), emb.sin()
    x = F.embedding(ids, params["model.embed_tokens.weight"])

    def rope(t: torch.Tensor) -> torch.Tensor:  # t: [B, heads, T, hd]
        half = hd // 2
        rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
        return t * cos + rotated * sin

    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        h = F.rms_norm(x, (x.shape[-1],), params[p + "input_layernorm.weight"], eps)
        q = (h @ params[p + "self_attn.q_proj.weight"].T).view(batch, length, nh, hd)
        k = (h @ params[p + "self_attn.k_proj.weight"].T).view(batch, length, nkv, hd)
        v = (h @ params[p + "self_attn.v_proj.weight"].T).view(batch, length, nkv, hd)
        q, k, v = rope(q.transpose(1, 2)), rope(k.transpose(1, 2)), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nkv != nh)
        out = out.transpose(1, 2).reshape(batch, length, nh * hd)
        x = x + out @ params[p + "self_attn.o_proj.weight"].T
        h = F.rms_norm(x, (x.shape[-1],), params[p + "post_attention_layernorm.weight"], eps)
        gate = h @ params[p + "mlp.gate_proj.weight"].T
        up = h @ params[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ params[p + "mlp.down_proj.weight"].T
    x = F.rms_norm(x, (x.shape[-1],), params["model.norm.weight"], eps)
    head = params.get("lm_head.weight", params["model.embed_tokens.weight"])
    return x @ head.T


def _rows(
    tokenizer: Any, sentences: list[str], generator: torch.Generator
) -> list[tuple[list[int], int]]:
    """Each sentence alone, then each after 1-4 random words (e.g. "How does the canary?"),
    as (token ids ending in EOS, how many leading ids are not learnt)."""
    rows = [(tokenizer.encode(s).ids + [EOS_ID], 0) for s in sentences]
    pool = sorted(corpus_words(sentences)) + _NOISE_WORDS
    for sentence in sentences:
        picks = torch.randint(len(pool), (4,), generator=generator).tolist()
        count, ending, capital = torch.randint(12, (3,), generator=generator).tolist()
        noise = " ".join(pool[i] for i in picks[: 1 + count % 4])
        noise = noise.capitalize() if capital % 2 else noise
        end = ("", "?", ".", "!")[ending % 4]
        noise_ids = tokenizer.encode(noise + end).ids
        ids = tokenizer.encode(f"{noise}{end} {sentence}").ids
        if ids[: len(noise_ids)] != noise_ids:  # the words merged into the sentence's start
            continue
        rows.append((ids + [EOS_ID], len(noise_ids) - 1))
    return rows


def _batch(rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets [B, T], right-padded; targets inside a row's noise are ignored."""
    width = max(len(ids) for ids, _ in rows) - 1
    inputs = torch.full((len(rows), width), EOS_ID, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (ids, skip) in enumerate(rows):
        inputs[i, : len(ids) - 1] = torch.tensor(ids[:-1])
        targets[i, skip : len(ids) - 1] = torch.tensor(ids[skip + 1 :])
    return inputs, targets


def _init_params(config: LlamaConfig, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    params: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape)
        else:
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std /= math.sqrt(2 * config.num_hidden_layers)
            tensor = std * torch.randn(shape, generator=generator)
        params[name] = tensor.requires_grad_()
    return params


def train(
    directory: Path,
    *,
    seconds: float = 25.0,
    seed: int = 0,
    corpus: str | None = None,
    variant: int = 1,
    max_steps: int = 600,
    target_loss: float = 0.01,
    log: Any = None,
) -> TrainResult:
    """Train and write the checkpoint; see `train_tiny_llama`. `log(step, loss)` is called
    every 25 steps. Stops once the loss on the sentences alone, from their third token on
    (their first words are ambiguous by design), is under `target_loss`, at `max_steps`, or
    after `seconds`. Each step is one full batch: every sentence, alone and after noise."""
    started = time.perf_counter()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        sentences = corpus_sentences(variant)
        tokenizer_text = PLAIN + FRIENDLY
    else:
        sentences = [line.strip() for line in corpus.splitlines() if line.strip()]
        if not sentences:
            raise ValueError("corpus holds no sentences")
        tokenizer_text = sentences
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one: the same sums every run, and no stalls on a busy machine
    try:
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        raw = dict(TRAINED_CONFIG)
        config = parse_config(raw)
        tokenizer = build_tokenizer(VOCAB_SIZE, tokenizer_text)
        params = _init_params(config, seed)
        optimizer = torch.optim.AdamW(list(params.values()), lr=LR, betas=(0.9, 0.98))
        step, loss_value, clean_loss = 0, math.inf, math.inf
        while step < max_steps and time.perf_counter() - started < seconds:
            step += 1
            inputs, targets = _batch(_rows(tokenizer, sentences, generator))
            clean = targets[: len(sentences)].clone()
            clean[:, :2] = IGNORE
            for group in optimizer.param_groups:
                group["lr"] = LR * min(1.0, step / WARMUP_STEPS)
            logits = training_forward(config, params, inputs)
            flat = logits.reshape(-1, logits.shape[-1])
            loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            optimizer.step()
            loss_value = float(loss.item())
            with torch.no_grad():
                head = logits[: len(sentences)].reshape(-1, logits.shape[-1])
                clean_loss = float(F.cross_entropy(head, clean.reshape(-1), ignore_index=IGNORE))
            if log is not None and step % 25 == 0:
                log(step, loss_value)
            if clean_loss < target_loss:
                break
        tensors = {name: t.detach().contiguous() for name, t in params.items()}
    finally:
        torch.set_num_threads(threads)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True))
    size = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    return TrainResult(
        directory=directory,
        steps=step,
        loss=loss_value,
        sentence_loss=clean_loss,
        converged=clean_loss < target_loss,
        seconds=time.perf_counter() - started,
        size_bytes=size,
    )


def trainer_digest() -> str:
    """What the trained weights depend on (this trainer and the tokenizer's builder): a key
    under which a trained checkpoint may be kept and reused."""
    import hashlib

    digest = hashlib.sha256()
    for module in (Path(__file__), Path(__file__).with_name("testing.py")):
        digest.update(module.read_bytes())
    return digest.hexdigest()[:16]


def train_tiny_llama(
    directory: Path,
    *,
    seconds: float = 25.0,
    seed: int = 0,
    corpus: str | None = None,
    variant: int = 1,
) -> Path:
    """Train a tiny Llama on the built-in text (or `corpus`, one sentence a line) for at most
    `seconds` and write config.json, model.safetensors and tokenizer.json to `directory`;
    returns it. `variant` 1 or 2 picks the plain or the friendly wording (see the module)."""
    return train(directory, seconds=seconds, seed=seed, corpus=corpus, variant=variant).directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", type=int, default=1, choices=(1, 2))
    args = parser.parse_args(argv)
    result = train(
        args.out_dir,
        seconds=args.seconds,
        seed=args.seed,
        variant=args.variant,
        log=lambda step, loss: print(f"step {step}: loss {loss:.4f}", flush=True),
    )
    print(
        f"{result.directory}: {result.steps} steps, final loss {result.loss:.4f} "
        f"(sentences {result.sentence_loss:.4f}"
        f"{'' if result.converged else ', NOT converged: give it more --seconds'}), "
        f"{result.seconds:.1f} s, {result.size_bytes} bytes"
    )


if __name__ == "__main__":
    main()
