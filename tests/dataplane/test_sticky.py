"""Sticky A/B assignment by a client key (serving.dataplane.sticky): a keyed hash to a stable
bucket, monotone in the canary percent; the header or the body's `user`; bounded keys; the
per-client record the split-consistency panel reads."""

from __future__ import annotations

import secrets

import pytest

from serving.dataplane.guard import Refused
from serving.dataplane.sticky import (
    MAX_CLIENT_KEY,
    PUBLISHED_CLIENTS,
    Client,
    SplitTracker,
    TrafficConfig,
    bucket_of,
    client_of,
    requested_group,
    sticky_group,
    version_headers,
)
from serving.dataplane.traffic import choose_group

SALT = bytes.fromhex("11" * 32)
STICKY = TrafficConfig(sticky=True, salt=SALT)


def test_same_key_same_bucket_and_group_for_a_percent() -> None:
    for n in range(200):
        key = f"user-{n}"
        first = client_of(STICKY, {"x-client-key": key}, {})
        again = client_of(STICKY, {"x-client-key": key}, {})
        assert first == again and first is not None
        assert 0 <= first.bucket < 100
        groups = {requested_group(STICKY, first, 30, None) for _ in range(5)}
        assert len(groups) == 1


def test_raising_the_percent_only_moves_clients_from_stable_to_canary() -> None:
    clients = [client_of(STICKY, {"x-client-key": f"c{n}"}, {}) for n in range(2000)]
    previous = {c.id: "stable" for c in clients if c}
    for percent in (0, 1, 5, 10, 12.5, 25, 50, 75, 99.5, 100):
        now = {c.id: sticky_group(c.bucket, percent) for c in clients if c}
        for cid, group in now.items():
            assert not (previous[cid] == "canary" and group == "stable"), (cid, percent)
        share = sum(g == "canary" for g in now.values()) / len(now)
        assert abs(share - percent / 100) < 0.04, (percent, share)
        previous = now
    assert set(previous.values()) == {"canary"}


def test_the_hash_is_keyed_by_the_deployment_salt() -> None:
    keys = [f"k{n}" for n in range(300)]
    other = bytes.fromhex("22" * 32)
    a = [sticky_group(bucket_of(SALT, k), 50) for k in keys]
    b = [sticky_group(bucket_of(other, k), 50) for k in keys]
    # Another salt assigns independently: about half of the keys change group.
    moved = sum(x != y for x, y in zip(a, b, strict=True)) / len(keys)
    assert 0.35 < moved < 0.65
    # The displayed id is neither the key nor the bucket's hash.
    client = client_of(STICKY, {"x-client-key": "alice"}, {})
    assert client is not None and "alice" not in client.id and len(client.id) == 16
    assert client_of(TrafficConfig(sticky=True, salt=other), {"x-client-key": "alice"}, {}) != (
        client
    )


def test_header_wins_over_the_user_field_and_user_is_a_key() -> None:
    by_header = client_of(STICKY, {"x-client-key": "alice"}, {"user": "bob"})
    by_user = client_of(STICKY, {}, {"user": "alice"})
    assert by_header == by_user  # the same key, wherever it came from
    assert client_of(STICKY, {}, {"user": "bob"}) != by_header
    # A custom header; the user field switched off; a user that is not a string.
    custom = TrafficConfig(sticky=True, header="x-tenant-user", salt=SALT)
    assert client_of(custom, {"x-tenant-user": "alice"}, {}) == by_header
    assert client_of(custom, {"x-client-key": "alice"}, {}) is None
    no_user = TrafficConfig(sticky=True, user_field=False, salt=SALT)
    assert client_of(no_user, {}, {"user": "alice"}) is None
    assert client_of(STICKY, {}, {"user": {"id": 1}}) is None
    assert client_of(STICKY, {"x-client-key": "   "}, {}) is None
    # No salt (an old config): nothing is recognised, never an unkeyed hash.
    assert client_of(TrafficConfig(sticky=True), {"x-client-key": "alice"}, {}) is None


def test_keyless_requests_keep_the_random_split_and_x_ab_group() -> None:
    assert requested_group(STICKY, None, 50, "canary") == "canary"
    assert requested_group(STICKY, None, 50, None) is None
    # Sticky: the key decides, a client's X-AB-Group does not override its bucket.
    client = Client("x" * 16, 70.0)
    assert requested_group(STICKY, client, 50, "canary") == "stable"
    # Not sticky: the key is only recognised (for the panel); the header still applies.
    loose = TrafficConfig(sticky=False, salt=SALT)
    assert requested_group(loose, client, 50, "canary") == "canary"
    assert choose_group(50, requested_group(STICKY, client, 50, None), has_canary=False) == (
        "stable"
    )


def test_a_too_long_key_is_refused_when_sticky_and_ignored_otherwise() -> None:
    long_key = "a" * (MAX_CLIENT_KEY + 1)
    with pytest.raises(Refused) as refused:
        client_of(STICKY, {"x-client-key": long_key}, {})
    assert refused.value.status == 400 and "x-client-key" in refused.value.message
    with pytest.raises(Refused) as by_user:
        client_of(STICKY, {}, {"user": long_key})
    assert "user" in by_user.value.message
    assert client_of(TrafficConfig(salt=SALT), {"x-client-key": long_key}, {}) is None
    assert client_of(STICKY, {"x-client-key": "a" * MAX_CLIENT_KEY}, {}) is not None


def test_a_bad_header_in_the_config_falls_back_to_the_default() -> None:
    for bad in ("authorization", "Cookie", "x b", "-x", "x" * 80):
        config = TrafficConfig.from_dict({"client_key_header": bad, "salt": "00"})
        assert config.header == "x-client-key"


def _config(percent: float, sticky: bool = True) -> dict[str, object]:
    return {
        "canary_percent": percent,
        "groups": {"stable": {"version": "v1"}, "canary": {"version": "v2"}},
        "traffic": {"sticky": sticky, "salt": SALT.hex()},
    }


def test_the_tracker_records_groups_per_client_and_resets_with_the_split() -> None:
    tracker = SplitTracker()
    tracker.configure(_config(40))
    alice = tracker.client({"x-client-key": "alice"}, {})
    bob = tracker.client({}, {"user": "bob"})
    assert alice is not None and bob is not None
    for _ in range(3):
        tracker.observe(alice, "canary")
    tracker.observe(bob, "stable")
    tracker.observe(bob, "distilled")  # a degraded tier is the stable side
    tracker.observe(bob, "canary")  # e.g. a breaker sent it to the other side
    tracker.observe(None, "canary")
    snap = tracker.snapshot()
    assert snap["percent"] == 40 and snap["sticky"] and snap["flipped"] == 1
    assert snap["keyed"] == {"stable": 2, "canary": 4} and snap["keyless"]["canary"] == 1
    rows = {row["id"]: row for row in snap["clients"]}
    assert rows[bob.id]["stable"] == 2 and rows[bob.id]["canary"] == 1
    assert snap["clients"][0]["id"] == bob.id  # flipped ones first
    assert rows[alice.id]["expected"] == sticky_group(alice.bucket, 40)
    assert "alice" not in repr(snap) and "bob" not in repr(snap) and SALT.hex() not in repr(snap)
    # Same split: kept. A new percent: a new record.
    tracker.configure(_config(40))
    assert tracker.snapshot()["tracked"] == 2
    tracker.configure(_config(60))
    assert tracker.snapshot()["tracked"] == 0 and tracker.snapshot()["percent"] == 60


def test_the_tracker_is_bounded() -> None:
    tracker = SplitTracker(size=50)
    tracker.configure(_config(10))
    for _ in range(500):
        tracker.observe(tracker.client({"x-client-key": secrets.token_hex(8)}, {}), "stable")
    snap = tracker.snapshot()
    assert snap["tracked"] == 50 and snap["forgotten"] == 450
    big = SplitTracker()
    big.configure(_config(10))
    for n in range(300):
        big.observe(big.client({"x-client-key": f"k{n}"}, {}), "stable")
    assert len(big.snapshot()["clients"]) == PUBLISHED_CLIENTS


def test_version_headers_say_what_answered() -> None:
    headers: dict[str, str] = {}
    config = {
        "groups": {
            "stable": {"version": "m:v1"},
            "canary": {"version": "m:v2"},
            "tier": {"version": "m:v4"},
        },
        "fingerprints": {"stable": "f" * 64, "canary": "c" * 64},
    }
    version_headers(headers, "stable", config)
    assert headers == {
        "x-ab-group": "stable",
        "x-model-version": "m:v1",
        "x-model-fingerprint": "f" * 64,
    }
    version_headers(headers, "canary", config, {"version": "m:v3", "fingerprint": "e"})
    assert headers["x-model-version"] == "m:v3" and headers["x-model-fingerprint"] == "e"
    version_headers(headers, "tier", config)
    assert headers["x-model-version"] == "m:v4"
    assert "x-model-fingerprint" not in headers  # unknown: not someone else's
