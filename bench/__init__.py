"""Benchmarks of the portal, run by hand (see bench/README.md); not part of the test suite."""
