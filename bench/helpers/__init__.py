"""Child processes of the benchmarks (run as scripts: standard library only)."""
