"""What every benchmark shares: isolation (settings, database, Redis prefixes), the processes it
starts, shielded teardown, statistics and reporting. Scenarios keep only measure + verdict.

Nothing here imports Django at module level: `env.isolate()` must run first."""

from bench.harness.session import BenchSession

__all__ = ["BenchSession"]
