"""Artifacts that travel (serving.registry.delivery, serving.dataplane.fetch): a version's files
fetched by a signed portal URL or from S3-compatible storage, checksummed, cached per node, and
what a node refuses to unpack. The Ray side is tests/serving/test_two_node_ray.py."""

from __future__ import annotations

import http.server
import io
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.test import Client

from serving.dataplane import fetch
from serving.deployments.specs import live_versions
from serving.engine.checkpoint import directory_sha256
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import delivery
from serving.registry.models import ModelVersion, VersionStatus
from tests.conftest import TenantWorld
from tests.ray_cluster import free_ports

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads the rows


def _ready(world: TenantWorld) -> ModelVersion:
    return ModelVersion.objects.get(tenant=world.tenant, label="s1", status=VersionStatus.READY)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "node-cache"
    monkeypatch.setenv("PORTAL_ARTIFACT_CACHE_DIR", str(root))
    return root


@pytest.fixture
def by_portal(settings: Any, live_server: Any, cache: Path) -> Path:
    settings.ARTIFACT_DELIVERY = "portal"
    settings.PORTAL_INTERNAL_URL = live_server.url
    return cache


def test_a_signed_url_delivers_the_files_checksummed_and_cached_once(
    world_a: TenantWorld, by_portal: Path
) -> None:
    version = _ready(world_a)
    source = delivery.source(version)
    assert source is not None and source["via"] == "portal"
    assert delivery.artifact_ref(version) == version.artifact_uri  # no path of the portal's
    path, info = fetch.local_artifact({"artifact": version.artifact_uri, "source": source})
    directory = Path(version.artifact_uri.removeprefix("file://"))
    assert path == by_portal / version.sha256 and directory_sha256(path) == version.sha256
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in directory.iterdir())
    assert info["cached"] is False
    assert info["bytes"] == delivery.tar_size(delivery.tar_entries(directory))
    again, info = fetch.local_artifact({"artifact": version.artifact_uri, "source": source})
    assert again == path and info["cached"] is True and info["bytes"] == 0
    # The URL is the same all through its TTL window (no reconfigure per reconcile).
    assert delivery.source(version) == source


def test_the_portal_serves_only_what_it_signed(world_a: TenantWorld, settings: Any) -> None:
    settings.ARTIFACT_DELIVERY, settings.PORTAL_INTERNAL_URL = "portal", "http://portal.test"
    version = _ready(world_a)
    other = ModelVersion.objects.exclude(pk=version.pk).first()
    assert other is not None
    http = Client()
    url = delivery.signed_url(version).removeprefix("http://portal.test")
    response = http.get(url)
    assert response.status_code == 200 and response["X-Artifact-Sha256"] == version.sha256
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content))) as archive:
        assert "config.json" in archive.getnames()

    path, query = url.split("?")
    refused = {
        "unsigned": path,
        "forged": f"{path}?exp=9999999999&sig={'0' * 64}",
        "another version": url.replace(f"/{version.pk}/", f"/{other.pk}/"),
        "expired": delivery.signed_url(version, now=time.time() - 10 * 86400).removeprefix(
            "http://portal.test"
        ),
    }
    for why, bad in refused.items():
        response = http.get(bad)
        assert response.status_code == 403, why
        assert "refused" in response.json()["error"]["message"], why

    ModelVersion.objects.filter(pk=version.pk).update(status=VersionStatus.FAILED)
    assert http.get(url).status_code == 404  # a version no longer ready is no longer served


def test_portal_delivery_needs_the_portals_internal_url(
    world_a: TenantWorld, settings: Any
) -> None:
    settings.ARTIFACT_DELIVERY, settings.PORTAL_INTERNAL_URL = "portal", ""
    with pytest.raises(Exception, match="PORTAL_INTERNAL_URL"):
        delivery.source(_ready(world_a))


# --- what a node refuses -------------------------------------------------------------------


class _Served:
    """A loopback HTTP server answering every GET with `body` (counting the GETs)."""

    def __init__(self) -> None:
        self.body, self.gets = b"", 0
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                served.gets += 1
                time.sleep(0.2)  # long enough for concurrent fetchers to queue on the lock
                self.send_response(200)
                self.send_header("Content-Length", str(len(served.body)))
                self.end_headers()
                self.wfile.write(served.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/a.tar"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def source(self, sha: str, size: int) -> dict[str, Any]:
        return {"via": "portal", "url": self.url, "sha256": sha, "bytes": size}


@pytest.fixture
def served() -> Iterator[_Served]:
    server = _Served()
    yield server
    server.server.shutdown()
    server.server.server_close()


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.django_db(transaction=False)
def test_a_node_refuses_what_the_portal_did_not_sign(
    served: _Served, cache: Path, tmp_path: Path
) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")
    sha = directory_sha256(checkpoint)
    other = write_tiny_checkpoint(tmp_path / "other", seed=7)
    entries = delivery.tar_entries(other)
    cases = {
        "checksum mismatch": b"".join(delivery.stream_tar(entries)),
        "unsafe entry": _tar([(_member("../escape.txt"), b"x")]),
        "not a regular file": _tar([(_member("link", tarfile.SYMTYPE, "/etc/passwd"), b"")]),
        "not a readable tar": b"this is not a tar archive" * 40,
    }
    for why, body in cases.items():
        served.body = body
        with pytest.raises(fetch.FetchError, match=why):
            fetch.fetch(served.source(sha, delivery.tar_size(entries)))
    # A member past the declared size and the slack: refused as it streams in.
    served.body = _tar([(_member("weights.bin"), b"\0" * (fetch.SLACK_BYTES + 4096))])
    with pytest.raises(fetch.FetchError, match="larger than"):
        fetch.fetch(served.source(sha, 1024))
    # Nothing refused is left where a replica would take it for verified.
    assert not (cache / sha).exists() and not (cache / f"{sha}.ok").exists()
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.django_db(transaction=False)
def test_replicas_of_one_node_fetch_once(served: _Served, cache: Path, tmp_path: Path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")
    entries = delivery.tar_entries(checkpoint)
    served.body = b"".join(delivery.stream_tar(entries))
    source = served.source(directory_sha256(checkpoint), delivery.tar_size(entries))
    results: list[tuple[Path, dict[str, Any]]] = []
    threads = [
        threading.Thread(target=lambda: results.append(fetch.fetch(source))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert served.gets == 1 and len(results) == 3
    assert sorted(info["cached"] for _, info in results) == [False, True, True]


# --- S3-compatible storage -------------------------------------------------------------------


@pytest.fixture
def s3(settings: Any, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from moto.server import ThreadedMotoServer

    (port,) = free_ports(1)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "portal-test",
        "AWS_SECRET_ACCESS_KEY": "portal-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    settings.ARTIFACT_DELIVERY = "s3"
    settings.ARTIFACT_S3_BUCKET = "models"
    settings.ARTIFACT_S3_ENDPOINT_URL = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=settings.ARTIFACT_S3_ENDPOINT_URL)
    client.create_bucket(Bucket="models")
    delivery._published.clear()
    yield client
    delivery._published.clear()
    server.stop()


def test_s3_delivery_uploads_once_and_nodes_read_it(world_a: TenantWorld, s3: Any) -> None:
    version = _ready(world_a)
    assert version in live_versions()  # what a reconcile publishes first
    assert delivery.publish([version, version]) == 1
    delivery._published.clear()  # a new portal process: the bucket already has it
    assert delivery.publish([version]) == 0
    listed = s3.list_objects_v2(Bucket="models")["Contents"]
    assert [o["Key"] for o in listed] == [f"portal-artifacts/{version.sha256}.tar"]
    source = delivery.source(version)
    assert source is not None and "secret" not in str(source)  # credentials stay in the env
    path, info = fetch.local_artifact({"artifact": version.artifact_uri, "source": source})
    assert directory_sha256(path) == version.sha256
    assert info["via"] == "s3" and info["cached"] is False and info["bytes"] > 0
