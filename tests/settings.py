"""Test settings: the real services on 127.0.0.1 (PostgreSQL, Redis), fast password hashing."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")


def _worker_redis_db() -> None:
    """Under pytest-xdist (`make test PYTEST_WORKERS=2`) each worker gets its own Redis db (the
    tests clear their key patterns between tests, so a shared db would let one worker wipe the
    other's rate buckets and SLI values). Written back to the environment once, so processes a
    test starts (a Celery worker, a bench) use the same db and do not shift it again."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or os.environ.get("PORTAL_TEST_REDIS_WORKER") == worker:
        return
    base, _, db = os.environ["REDIS_URL"].rpartition("/")
    number = (int(db or 0) + int(worker[2:])) % 16
    os.environ["REDIS_URL"] = f"{base}/{number}"
    os.environ["PORTAL_TEST_REDIS_WORKER"] = worker


_worker_redis_db()
os.environ.setdefault("CACHE_KEY_PREFIX", "portal-test")
os.environ.setdefault("CHANNEL_PREFIX", "portal-test:asgi")
os.environ.setdefault("RATE_LIMIT_KEY_PREFIX", "portal-test:rl")
# One host: replicas read the portal's files in place, unless a test says otherwise (the
# two-node and delivery tests set ARTIFACT_DELIVERY=portal with the live server's URL).
os.environ.setdefault("ARTIFACT_DELIVERY", "path")

from portal.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
# Unit tests have no Ray; the Ray tests call serving.control.reconcile with the test cluster.
RECONCILE_ON_COMMIT = os.environ.get("PORTAL_TEST_RECONCILE") == "1"  # a worker test's choice
CLUSTER_CAPACITY = False  # no cluster to ask; the Ray tests turn it on with theirs
SLI_KEY_PREFIX = "portal-test"
WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]  # the webhook receivers of the tests

if os.environ.get("PORTAL_TEST_WORKER"):
    # A real Celery worker started by the tests: it consumes from Redis and writes mail to files.
    CELERY_TASK_ALWAYS_EAGER = False
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
