"""Settings of the benchmarks: the test settings (the real services on 127.0.0.1), with the key
prefixes `bench.harness.env.isolate` put in the environment, Celery's broker and result keys
included, so a bench worker never shares queues with a test worker on the same Redis db."""

import os

from tests.settings import *  # noqa: F403

SLI_KEY_PREFIX = os.environ.get("SLI_KEY_PREFIX", "portal-bench")
_BENCH_PREFIX = os.environ.get("BENCH_PREFIX")
if _BENCH_PREFIX and REDIS_URL:  # noqa: F405
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"{_BENCH_PREFIX}:celery:"}
    CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": f"{_BENCH_PREFIX}:celery:"}
