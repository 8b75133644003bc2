"""How hint feedback changes a tenant's hints (pure functions, no database).

Each cause of a tenant carries a Beta(1 + right, 1 + wrong) belief that it is right when it
matches; its posterior mean p = (1 + right) / (2 + right + wrong) is 1/2 before any vote. The
cause's score is multiplied by 2p, so the multiplier starts at 1, stays inside (0, 2) however
many votes come (bounded: a flood of votes can at most double or nearly zero a cause), and
moves less with every vote (a Beta mean). A cause whose multiplier falls under MUTE_BELOW
(p < 1/4: e.g. 0 right and 3 wrong) is muted: listed apart, not among the likely causes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from incidents.rca.hints import Hint

PRIOR_RIGHT = 1.0
PRIOR_WRONG = 1.0
MUTE_BELOW = 0.5


def cause_key(name: str) -> str:
    return name.strip().casefold()[:200]


def multiplier(right: int, wrong: int) -> float:
    """2 x the Beta posterior mean of "this cause is right": 1.0 with no votes, in (0, 2)."""
    mean = (PRIOR_RIGHT + right) / (PRIOR_RIGHT + PRIOR_WRONG + right + wrong)
    return round(2.0 * mean, 4)


def apply_feedback(
    hints: Iterable[Hint], weights: Mapping[str, tuple[int, int]]
) -> tuple[list[Hint], list[Hint]]:
    """(likely, muted): hints re-scored by the tenant's votes {cause key: (right, wrong)},
    best first (ties by name)."""
    likely, muted = [], []
    for hint in hints:
        right, wrong = weights.get(cause_key(hint.cause), (0, 0))
        factor = multiplier(right, wrong)
        scored = replace(
            hint,
            base_score=hint.score,
            score=round(hint.score * factor, 3),
            multiplier=factor,
            right=right,
            wrong=wrong,
        )
        (muted if factor < MUTE_BELOW else likely).append(scored)

    def order(h: Hint) -> tuple[float, str]:
        return (-h.score, h.cause)

    return sorted(likely, key=order), sorted(muted, key=order)
