"""The router's online input-drift detector (seed 000 §3.1, the σ of SelectModelBranch): each
prompt's features (its length bucket, its characters' classes) are compared with a reference
taken from the deployment's first requests, as a KL divergence normalised to [0, 1)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Length buckets: floor(log2(len + 1)), capped (a 4096-character prompt and longer share one).
LENGTH_BUCKETS = 13
# Character classes: lower-case ASCII, upper-case ASCII, digit, white space, ASCII punctuation,
# other (non-ASCII: another script, emoji).
CHAR_CLASSES = 6
# Laplace smoothing: a bin never seen in the reference costs a finite divergence.
SMOOTHING = 0.5
# Only the first characters of a prompt are read: the detector's cost is bounded per request.
MAX_CHARS = 4096


def length_bucket(prompt: str) -> int:
    return min(LENGTH_BUCKETS - 1, int(math.log2(len(prompt) + 1)))


def char_classes(prompt: str) -> list[int]:
    counts = [0] * CHAR_CLASSES
    for ch in prompt[:MAX_CHARS]:
        if not ch.isascii():
            counts[5] += 1
        elif ch.islower():
            counts[0] += 1
        elif ch.isupper():
            counts[1] += 1
        elif ch.isdigit():
            counts[2] += 1
        elif ch.isspace():
            counts[3] += 1
        else:
            counts[4] += 1
    return counts


def normalized_kl(observed: list[float], reference: list[float]) -> float:
    """1 - exp(-KL(observed || reference)), both smoothed: 0 for the same distribution,
    towards 1 as they part."""
    p_total = sum(observed) + SMOOTHING * len(observed)
    q_total = sum(reference) + SMOOTHING * len(reference)
    kl = 0.0
    for o, r in zip(observed, reference, strict=True):
        p = (o + SMOOTHING) / p_total
        q = (r + SMOOTHING) / q_total
        kl += p * math.log(p / q)
    return 1.0 - math.exp(-max(0.0, kl))


@dataclass
class _Histograms:
    lengths: list[float]
    chars: list[float]

    @classmethod
    def empty(cls) -> _Histograms:
        return cls([0.0] * LENGTH_BUCKETS, [0.0] * CHAR_CLASSES)

    def add(self, bucket: int, chars: list[int], sign: float = 1.0) -> None:
        self.lengths[bucket] += sign
        total = sum(chars) or 1
        for i, count in enumerate(chars):  # each prompt weighs the same, whatever its length
            self.chars[i] += sign * count / total


class DriftDetector:
    """σ over the last `window` prompts against the first `reference` prompts seen: the larger
    of the length and character-class divergences. None until both are full."""

    def __init__(self, *, reference: int = 50, window: int = 50) -> None:
        self.reference_size, self.window_size = reference, window
        self.reference = _Histograms.empty()
        self.reference_count = 0
        self.window = _Histograms.empty()
        self.recent: deque[tuple[int, list[int]]] = deque()
        self.sigma: float | None = None

    def observe(self, prompt: str) -> float | None:
        bucket, chars = length_bucket(prompt), char_classes(prompt)
        if self.reference_count < self.reference_size:
            self.reference.add(bucket, chars)
            self.reference_count += 1
            return None
        self.window.add(bucket, chars)
        self.recent.append((bucket, chars))
        if len(self.recent) > self.window_size:
            old_bucket, old_chars = self.recent.popleft()
            self.window.add(old_bucket, old_chars, -1.0)
        if len(self.recent) < self.window_size:
            return None
        self.sigma = max(
            normalized_kl(self.window.lengths, self.reference.lengths),
            normalized_kl(self.window.chars, self.reference.chars),
        )
        return self.sigma

    def snapshot(self) -> dict[str, float | int | None]:
        return {
            "sigma": None if self.sigma is None else round(self.sigma, 4),
            "reference": self.reference_count,
            "window": len(self.recent),
        }
