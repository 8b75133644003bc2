"""Root-cause analysis: evidence, cause rules and hints, postmortems."""
