"""cProfile helpers of the benchmarks."""

from __future__ import annotations

import cProfile
import pstats


class Stream:
    """A write() target that keeps the text (pstats prints to a stream)."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s


def top(profiler: cProfile.Profile | pstats.Stats, sort: str, limit: int = 25) -> str:
    """The top `limit` entries by `sort`, as text."""
    stream = Stream()
    stats = pstats.Stats(profiler, stream=stream)  # type: ignore[arg-type]
    stats.strip_dirs().sort_stats(sort).print_stats(limit)
    return stream.text
