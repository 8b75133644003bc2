"""The portal image's entrypoint: one word names the process, the rest is passed on.

    web [args]           the ASGI server (portal.serve) on 0.0.0.0:$PORT (8000)
    worker [args]        a Celery worker; give it its queues: worker -Q default,chaos
    beat [args]          Celery beat (exactly one per installation)
    setup                migrate, then collect the static files into PORTAL_DATA_DIR/static
    manage ARGS          python manage.py ARGS
    healthcheck URL...   exit 0 when every http(s) URL answers 200 and every tcp://HOST:PORT
                         accepts a connection (no HOST: this container's own address)
    anything else        run as given (ray, bash, ...)

It replaces itself with the process (exec), so signals reach it directly. Standard library
only, so the healthcheck costs no Django start.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request
from urllib.parse import urlsplit

APP = "/app"
PYTHON = sys.executable or "python"
BEAT_SCHEDULE = "/tmp/celerybeat-schedule"  # noqa: S108 (beat's DatabaseScheduler ignores it)


def command(args: list[str]) -> list[list[str]]:
    """The commands one invocation runs, in order (all but the last are waited for)."""
    word, rest = (args[0], args[1:]) if args else ("web", [])
    manage = [PYTHON, f"{APP}/manage.py"]
    celery = [PYTHON, "-m", "celery", "-A", "portal"]
    port = os.environ.get("PORT", "8000")
    if word == "web":
        return [[PYTHON, "-m", "portal.serve", "--host", "0.0.0.0", "--port", port, *rest]]  # noqa: S104
    if word == "worker":
        flags = ["--loglevel", "INFO", "--without-gossip", "--without-mingle"]
        return [[*celery, "worker", *flags, *rest]]
    if word == "beat":
        return [[*celery, "beat", "--loglevel", "INFO", "--schedule", BEAT_SCHEDULE, *rest]]
    if word == "setup":
        return [[*manage, "migrate", "--noinput"], [*manage, "collectstatic", "--noinput", *rest]]
    if word == "manage":
        return [[*manage, *rest]]
    return [args]


def healthcheck(targets: list[str], timeout: float = 5.0) -> list[str]:
    """What failed, one line per target; empty when all answered."""
    failed = []
    for target in targets:
        parts = urlsplit(target)
        try:
            if parts.scheme == "tcp":
                host = parts.hostname or socket.gethostbyname(socket.gethostname())
                with socket.create_connection((host, parts.port or 0), timeout=timeout):
                    pass
            elif parts.scheme in ("http", "https"):
                with urllib.request.urlopen(target, timeout=timeout) as response:  # noqa: S310
                    if response.status != 200:
                        failed.append(f"{target}: HTTP {response.status}")
            else:
                failed.append(f"{target}: give http://, https:// or tcp:// URLs")
        except OSError as exc:  # URLError and HTTPError (a 503) included
            failed.append(f"{target}: {exc}")
    return failed


def main(args: list[str]) -> None:
    if args[:1] == ["healthcheck"]:
        failed = healthcheck(args[1:]) if args[1:] else ["healthcheck: name a URL"]
        for line in failed:
            print(line, file=sys.stderr)
        raise SystemExit(1 if failed else 0)
    os.chdir(APP)
    *before, last = command(args)
    for argv in before:
        status = os.spawnvp(os.P_WAIT, argv[0], argv)  # noqa: S606 (fixed argv)
        if status != 0:
            raise SystemExit(f"{' '.join(argv[1:4])} failed with status {status}")
    os.execvp(last[0], last)  # noqa: S606 (the container's one process)


if __name__ == "__main__":
    main(sys.argv[1:])
