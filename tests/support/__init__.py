"""Builders shared by the tests and the benchmarks (bench/): worlds made through the services,
SLA contract documents. Importing `worlds` needs Django set up."""
