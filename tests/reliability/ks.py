"""Two-sample Kolmogorov-Smirnov test (scipy is not a dependency): the statistic and its
asymptotic p-value with the usual small-sample correction (Numerical Recipes' `kstwo`)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def ks_statistic(first: Sequence[float], second: Sequence[float]) -> float:
    """D = sup_x |F1(x) - F2(x)| over the two empirical distribution functions."""
    if not first or not second:
        raise ValueError("both samples must be non-empty")
    a, b = sorted(first), sorted(second)
    n, m = len(a), len(b)
    # The ECDFs only step at sample values; bisect_right counts ties on the left of the step.
    return max(abs(bisect.bisect_right(a, x) / n - bisect.bisect_right(b, x) / m) for x in a + b)


def kolmogorov_sf(lam: float) -> float:
    """Q_KS(lam) = P(K > lam) = 2 * sum_{k>=1} (-1)^(k-1) exp(-2 k^2 lam^2), in [0, 1].

    Below lam = 1.18 the alternating series converges slowly, so the same function is summed
    in its Jacobi-theta form 1 - sqrt(2 pi) / lam * sum_{k>=1} exp(-(2k-1)^2 pi^2 / (8 lam^2))."""
    if lam <= 0:
        return 1.0
    if lam < 1.18:
        terms = (math.exp(-((2 * k - 1) ** 2) * math.pi**2 / (8 * lam * lam)) for k in range(1, 8))
        value = 1.0 - math.sqrt(2 * math.pi) / lam * sum(terms)
    else:
        value = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, value))


def ks_2samp(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """(D, p) for H0 "both samples come from one continuous distribution"."""
    d = ks_statistic(first, second)
    n, m = len(first), len(second)
    en = math.sqrt(n * m / (n + m))
    return d, kolmogorov_sf((en + 0.12 + 0.11 / en) * d)
