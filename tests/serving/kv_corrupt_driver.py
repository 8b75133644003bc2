"""Test-only: corrupt a live replica's KV block pool, as a bug in the engine would. Run as its
own Ray driver (`python kv_corrupt_driver.py <gcs address> <app>`; RAY_AUTH_MODE/RAY_AUTH_TOKEN
in its environment), it finds the app's router replica and, inside it (`__ray_call__`, the
actor's own process), adds a reference nobody holds to a registered block of the stable slot's
pool. Only someone holding the cluster's token can do this; no route or handle method of the
product reaches it (tests/serving/test_kv_integrity_ray.py)."""

from __future__ import annotations

import sys
from typing import Any

import ray
from ray.util import list_named_actors


def corrupt(replica_actor: Any) -> int:
    router = replica_actor._replica_impl._user_callable_wrapper.user_callable
    engine = router.local.engine  # the stable slot's AsyncEngine, in the router's replica
    with engine._lock:  # between two steps, like a real bug's write would land
        pool = engine.engine.pool
        block = next((b for b in pool._blocks if b.hash is not None), pool._blocks[0])
        block.ref += 1
        return int(block.id)


def main(address: str, app: str) -> None:
    ray.init(
        address=address,
        namespace="serve",
        _node_ip_address="127.0.0.1",  # the head's own (serving.control.cluster.head)
        logging_level="ERROR",
        log_to_driver=False,
    )
    try:
        prefix = f"SERVE_REPLICA::{app}#router#"
        names = [a["name"] for a in list_named_actors(all_namespaces=True)]
        name = next(n for n in names if n.startswith(prefix))
        actor = ray.get_actor(name, namespace="serve")
        print(ray.get(actor.__ray_call__.remote(corrupt), timeout=60))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
