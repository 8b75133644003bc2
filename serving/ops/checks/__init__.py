"""Checks of a version before and while it serves: the golden-prompt consistency probe's task,
and the pre-canary verification and benchmark of a ready version (`VersionCheck`)."""
