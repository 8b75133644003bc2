"""Deployment pages: the list and the create form (key shown once, curl example), inline service
errors, scale / canary / traffic / promote through the forms with revision diffs, the live status
panel (htmx polling), inference keys, delete; roles and foreign tenants."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from serving.control.cluster import ray_target_from_env
from serving.deployments.models import (
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
    InferenceKey,
)
from serving.registry import services as serving_services
from serving.registry.models import Model, ModelVersion
from tenants.actors import Actor
from tests.conftest import TenantWorld, world_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def data_dir(settings: Any, tmp_path: Path) -> Path:
    """The curl example reads the Serve URL from the Ray target, which keeps its token under
    DATA_DIR: a temp dir here, never the checkout's var/."""
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


def _deployment(world: TenantWorld, name: str = "assistant") -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name=name, deleted_at__isnull=True)


def _served_version(world: TenantWorld, label: str = "s1") -> ModelVersion:
    return ModelVersion.objects.get(tenant=world.tenant, model__name="served", label=label)


def _second_ready_version(world: TenantWorld) -> ModelVersion:
    actor = Actor(user=world.owner)
    served = Model.objects.get(tenant=world.tenant, name="served")
    version = serving_services.version_register_path(
        tenant=world.tenant, actor=actor, model=served, label="s2", path=str(world_checkpoint())
    )
    serving_services.version_validate(tenant=world.tenant, version_id=version.pk)
    return version


def _url(world: TenantWorld, name: str, deployment: Deployment | None = None, **extra: Any) -> str:
    kwargs: dict[str, Any] = {"slug": world.tenant.slug, **extra}
    if name != "serving-deployments":
        kwargs["pk"] = (deployment or _deployment(world)).pk
    return reverse(name, kwargs=kwargs)


def _create_data(world: TenantWorld, **overrides: Any) -> dict[str, Any]:
    return {
        "name": "web",
        "version": _served_version(world).pk,
        "description": "",
        "scaling": "fixed",
        "num_replicas": 1,
        "min_replicas": 1,
        "max_replicas": "",
        "target_ongoing_requests": 2,
        "num_cpus": 0.25,
        "num_gpus": 0,
        "max_ongoing_requests": 8,
        "kv_blocks": 256,
        "block_size": 16,
        **overrides,
    }


def _field_block(content: bytes, field: str) -> str:
    """The rendered form group (label, help, errors, widget) of one field."""
    html = content.decode()
    blocks = [b for b in html.split('<div class="field">') if f'name="{field}"' in b]
    assert blocks, f"no field {field} on the page"
    return blocks[0]


def _scale_data(revision: DeploymentRevision, **overrides: Any) -> dict[str, Any]:
    return {
        "scaling": "fixed",
        "num_replicas": revision.num_replicas or 1,
        "min_replicas": 1,
        "max_replicas": "",
        "target_ongoing_requests": 2,
        "num_cpus": revision.num_cpus,
        "num_gpus": revision.num_gpus,
        "max_ongoing_requests": revision.max_ongoing_requests,
        "kv_blocks": revision.kv_blocks,
        "block_size": revision.block_size,
        **overrides,
    }


def test_list_shows_the_worlds_deployment(
    client: Any, world_a: TenantWorld, django_assert_max_num_queries: Any
) -> None:
    client.force_login(world_a.operator)
    url = _url(world_a, "serving-deployments")
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'href="{url}"' in html  # the nav link
    assert 'data-testid="deployments-table"' in html and 'data-testid="deployment-form"' in html
    row = html.split('data-testid="deployment-row"')[1].split("</tr>")[0]
    assert ">assistant</a>" in row and 'class="badge pending"' in row
    assert "served:s1" in row and "#1" in row and "<code>/acme/assistant/v1</code>" in row
    assert "revision 1: created with served:s1" in row  # the status message
    # The version picker offers ready versions only (the world's own "v1" is registered only).
    picker = _field_block(page.content, "version")
    assert "served · s1" in picker and "assistant · v1" not in picker
    # A query budget that does not grow with the number of deployments.
    client.post(url, _create_data(world_a, name="second"))
    with django_assert_max_num_queries(12):
        assert client.get(url).content.count(b'data-testid="deployment-row"') == 2


def test_create_shows_the_key_once_with_a_curl_example(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.operator)
    url = _url(world_a, "serving-deployments")
    response = client.post(url, _create_data(world_a, description="the web app"))
    assert response.status_code == 200
    deployment = _deployment(world_a, "web")
    raw = re.search(rb'data-testid="key-secret">(ik_[\w-]+)<', response.content)
    assert raw is not None
    key = raw.group(1).decode()
    stored = InferenceKey.objects.get(deployment=deployment)
    assert stored.key_hash == hashlib.sha256(key.encode()).hexdigest() and stored.name == "default"
    serve_url = ray_target_from_env().serve_url
    curl = response.content.decode().split('data-testid="curl-example">')[1].split("</pre>")[0]
    assert f"curl {serve_url}/acme/web/v1/completions" in curl
    assert f"Authorization: Bearer {key}" in curl and "&quot;prompt&quot;" not in curl
    revision = deployment.current_revision
    assert revision is not None and revision.number == 1
    assert (revision.num_replicas, revision.num_cpus, revision.max_ongoing_requests) == (1, 0.25, 8)
    # Shown once: neither the list nor the deployment page shows it again.
    assert key.encode() not in client.get(url).content
    detail = client.get(_url(world_a, "serving-deployment", deployment))
    assert detail.status_code == 200 and key.encode() not in detail.content
    assert b'data-testid="revision-row" data-number="1"' in detail.content
    assert b"first revision" in detail.content and b"the web app" in detail.content
    assert stored.key_hash.encode() not in detail.content

    auto = client.post(
        url,
        _create_data(world_a, name="auto", scaling="autoscaling", num_replicas="", max_replicas=2),
    )
    assert auto.status_code == 200 and b'data-testid="new-key"' in auto.content
    revision = _deployment(world_a, "auto").current_revision
    assert revision is not None and revision.num_replicas is None
    assert revision.autoscaling == {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 2.0,
    }
    assert "auto 1–2" in client.get(url).content.decode()


def test_service_errors_show_inline_next_to_their_field(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.owner)
    url = _url(world_a, "serving-deployments")
    quota = client.post(url, _create_data(world_a, num_replicas=10))
    assert quota.status_code == 200 and b'data-testid="new-key"' not in quota.content
    block = _field_block(quota.content, "num_replicas")
    assert "errorlist" in block and "the tenant&#x27;s quota is 4 (max_replicas)" in block
    # With autoscaling the replica quota counts the maximum, so the error sits there.
    auto = client.post(
        url, _create_data(world_a, scaling="autoscaling", num_replicas="", max_replicas=10)
    )
    assert "quota is 4 (max_replicas)" in _field_block(auto.content, "max_replicas")
    assert "errorlist" not in _field_block(auto.content, "num_replicas")
    small = client.post(url, _create_data(world_a, kv_blocks=8))
    assert "must be between 16 and" in _field_block(small.content, "kv_blocks")
    name = client.post(url, _create_data(world_a, name="Not_A_Label"))
    assert "lower-case letters" in _field_block(name.content, "name")
    taken = client.post(url, _create_data(world_a, name="assistant"))
    assert "a deployment named &#x27;assistant&#x27; exists" in _field_block(taken.content, "name")
    shape = client.post(url, _create_data(world_a, num_replicas=""))
    assert "Give a number of replicas." in _field_block(shape.content, "num_replicas")
    assert set(Deployment.objects.filter(tenant=world_a.tenant).values_list("name", flat=True)) == {
        "assistant"
    }


def test_canary_traffic_and_promote_make_revisions_with_diffs(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.operator)
    deployment = _deployment(world_a)
    detail = _url(world_a, "serving-deployment")
    page = client.get(detail)
    assert b'data-testid="no-canary-versions"' in page.content  # only the stable one is ready
    assert b'data-testid="canary-form"' not in page.content
    assert b'data-testid="traffic-form"' not in page.content  # no canary yet
    assert b'data-testid="promote-form"' not in page.content
    s2 = _second_ready_version(world_a)
    page = client.get(detail)
    assert b'data-testid="canary-form"' in page.content
    canary_form = page.content.decode().split('data-testid="canary-form"')[1].split("</form>")[0]
    assert "served · s2" in canary_form and "served · s1" not in canary_form

    canary = _url(world_a, "serving-deployment-canary")
    same = client.post(canary, {"version": _served_version(world_a).pk, "percent": 20})
    assert same.status_code == 200 and "Select a valid choice" in same.content.decode()
    over = client.post(canary, {"version": s2.pk, "percent": 150})
    over_form = over.content.decode().split('data-testid="canary-form"')[1].split("</form>")[0]
    assert "must be between 0 and 100" in over_form
    assert deployment.revisions.count() == 1

    response = client.post(
        _url(world_a, "serving-deployment-canary"), {"version": s2.pk, "percent": 20}
    )
    assert response.status_code == 302 and response["Location"] == detail
    page = client.get(detail)
    assert b'data-testid="traffic-form"' in page.content
    assert b'id="traffic-slider"' in page.content and b'data-testid="promote-form"' in page.content

    too_much = client.post(_url(world_a, "serving-deployment-traffic"), {"percent": 150})
    assert too_much.status_code == 200
    assert (
        "must be between 0 and 100"
        in too_much.content.decode().split('data-testid="traffic-form"')[1]
    )
    assert (
        client.post(_url(world_a, "serving-deployment-traffic"), {"percent": 50}).status_code == 302
    )
    assert client.post(_url(world_a, "serving-deployment-promote")).status_code == 302

    numbers = list(deployment.revisions.order_by("number").values_list("number", "reason"))
    assert [n for n, _ in numbers] == [1, 2, 3, 4]
    assert numbers[1:] == [
        (2, "canary at 20%"),
        (3, "canary traffic 50%"),
        (4, "canary promoted to stable"),
    ]
    current = _deployment(world_a).current_revision
    assert current is not None and current.stable_version_id == s2.pk
    assert current.canary_version_id is None

    page = client.get(detail)
    html = page.content.decode()
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(
            r'data-testid="revision-row" data-number="(\d+)".*?>(.*?)</tr>', html, re.S
        )
    }
    assert "canary_version none -> served:s2" in rows[2] and "canary_percent 0 -> 20" in rows[2]
    assert "canary_percent 20 -> 50" in rows[3]
    assert "stable_version served:s1 -> served:s2" in rows[4]
    assert "canary_version served:s2 -> none" in rows[4] and "canary_percent 50 -> 0" in rows[4]
    assert world_a.operator.email in rows[4]
    assert b'data-testid="traffic-form"' not in page.content  # the canary is gone
    # Promoting again: there is no canary, said as a message.
    again = client.post(_url(world_a, "serving-deployment-promote"), follow=True)
    assert b"there is no canary to promote" in again.content
    assert deployment.revisions.count() == 4


def test_scale_form_changes_replicas_and_shows_quota_inline(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.owner)
    deployment = _deployment(world_a)
    revision = deployment.current_revision
    assert revision is not None
    url = _url(world_a, "serving-deployment-scale")
    page = client.get(_url(world_a, "serving-deployment"))
    assert 'value="0.25"' in _field_block(page.content, "num_cpus")  # prefilled from revision 1
    unchanged = client.post(url, _scale_data(revision), follow=True)
    assert b"Nothing changed." in unchanged.content and deployment.revisions.count() == 1
    assert client.post(url, _scale_data(revision, num_replicas=3)).status_code == 302
    scaled = _deployment(world_a).current_revision
    assert scaled is not None and (scaled.number, scaled.num_replicas) == (2, 3)
    assert scaled.reason == "changed num_replicas"
    refused = client.post(url, _scale_data(revision, num_replicas=5))
    assert refused.status_code == 200
    assert "quota is 4 (max_replicas)" in _field_block(refused.content, "num_replicas")
    page = client.get(_url(world_a, "serving-deployment"))
    assert "num_replicas 1 -> 3" in page.content.decode()
    # Through the API the reason is built the same way: only the fields that change.
    patched = world_a.client().patch(
        f"/api/v1/deployments/{deployment.pk}/",
        {"num_replicas": 3, "num_cpus": 0.5},
        format="json",
    )
    assert patched.status_code == 200, patched.content
    assert _deployment(world_a).current_revision.reason == "changed num_cpus"


def test_status_partial_renders_and_polls(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.viewer)
    deployment = _deployment(world_a)
    url = _url(world_a, "serving-deployment-status")
    page = client.get(_url(world_a, "serving-deployment"))
    assert f'hx-get="{url}" hx-trigger="every 2s"'.encode() in page.content
    partial = client.get(url)
    assert partial.status_code == 200 and partial.content.lstrip().startswith(b"<section")
    assert (
        b'hx-trigger="every 2s"' in partial.content and b'class="badge pending"' in partial.content
    )
    assert b"#1" in partial.content and b"not yet" in partial.content
    # What reconcile writes shows up on the next poll.
    now = timezone.now()
    Deployment.objects.filter(pk=deployment.pk).update(
        status=DeploymentStatus.RUNNING, status_message="1 replica healthy", status_at=now
    )
    revision = deployment.current_revision
    assert revision is not None
    revision.applied_at = revision.converged_at = now
    revision.serve_status = "RUNNING"
    revision.save(update_fields=["applied_at", "converged_at", "serve_status"])
    partial = client.get(url)
    assert b'class="badge running"' in partial.content and b"1 replica healthy" in partial.content
    assert b"not yet" not in partial.content and b"RUNNING" in partial.content


def test_inference_keys_are_shown_once_and_revoked_by_owners(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.owner)
    deployment = _deployment(world_a)
    detail = _url(world_a, "serving-deployment")
    created = client.post(_url(world_a, "serving-deployment-key-create"), {"name": "web-app"})
    assert created.status_code == 200 and b'data-testid="new-key"' in created.content
    key = InferenceKey.objects.get(deployment=deployment, name="web-app")
    raw = re.search(rb'data-testid="key-secret">(ik_[\w-]+)<', created.content)
    assert raw is not None
    assert hashlib.sha256(raw.group(1)).hexdigest() == key.key_hash
    assert b"/acme/assistant/v1/completions" in created.content
    status = created.content.decode().split('data-testid="status-message">')[1]
    assert status.startswith(f"revision 2: key {key.prefix} added")  # not the stale revision 1
    page = client.get(detail)
    assert raw.group(1) not in page.content
    assert page.content.count(b'data-testid="key-row"') == 2
    assert b"keys rotated" in page.content
    for stored in InferenceKey.objects.filter(deployment=deployment):
        assert stored.key_hash.encode() not in page.content
        assert stored.key_hash[:16].encode() not in page.content
    blank = client.post(_url(world_a, "serving-deployment-key-create"), {"name": " "})
    key_form = blank.content.decode().split('data-testid="key-form"')[1].split("</form>")[0]
    assert "errorlist" in key_form and b'data-testid="new-key"' not in blank.content

    revoke = _url(world_a, "serving-deployment-key-revoke", key_pk=key.pk)
    row = client.post(revoke, HTTP_HX_REQUEST="true")
    assert row.status_code == 200 and row.content.lstrip().startswith(b"<tr")
    assert b'data-testid="key-status">revoked' in row.content and b"Revoke" not in row.content
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert deployment.revisions.order_by("-number").first().reason == f"key {key.prefix} revoked"
    other = InferenceKey.objects.get(deployment=deployment, name="default")
    followed = client.post(
        _url(world_a, "serving-deployment-key-revoke", key_pk=other.pk), follow=True
    )
    assert f"Revoked key default ({other.prefix}…)".encode() in followed.content


def test_delete_removes_the_deployment(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.operator)
    deployment = _deployment(world_a)
    detail = _url(world_a, "serving-deployment")
    assert b'data-testid="delete-form"' in client.get(detail).content
    response = client.post(_url(world_a, "serving-deployment-delete"))
    assert response.status_code == 302
    assert response["Location"] == _url(world_a, "serving-deployments")
    deployment.refresh_from_db()
    assert deployment.deleted_at is not None and deployment.status == DeploymentStatus.DELETING
    listing = client.get(response["Location"])
    assert b"Deleted deployment assistant" in listing.content
    assert b'data-testid="deployment-row"' not in listing.content
    assert client.get(detail).status_code == 404
    assert client.post(_url(world_a, "serving-deployment-delete", deployment)).status_code == 404


def test_viewers_read_and_operators_do_not_manage_keys(client: Any, world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    key = InferenceKey.objects.get(deployment=deployment)
    s2 = _second_ready_version(world_a)
    forms = (b"scale-form", b"canary-form", b"key-form", b"delete-form")
    client.force_login(world_a.viewer)
    listing = client.get(_url(world_a, "serving-deployments"))
    assert listing.status_code == 200 and b"assistant" in listing.content
    assert b'data-testid="deployment-form"' not in listing.content
    assert (
        client.post(_url(world_a, "serving-deployments"), _create_data(world_a)).status_code == 403
    )
    page = client.get(_url(world_a, "serving-deployment"))
    assert page.status_code == 200 and b'data-testid="deployment-status"' in page.content
    assert not any(b'data-testid="' + f + b'"' in page.content for f in forms)
    assert b'data-testid="keys-table"' not in page.content
    posts = {
        "serving-deployment-scale": _scale_data(deployment.current_revision, num_replicas=2),
        "serving-deployment-canary": {"version": s2.pk, "percent": 10},
        "serving-deployment-traffic": {"percent": 10},
        "serving-deployment-promote": {},
        "serving-deployment-delete": {},
        "serving-deployment-key-create": {"name": "sneaky"},
    }
    for name, data in posts.items():
        assert client.post(_url(world_a, name), data).status_code == 403, name
    revoke = _url(world_a, "serving-deployment-key-revoke", key_pk=key.pk)
    assert client.post(revoke).status_code == 403

    client.force_login(world_a.operator)
    page = client.get(_url(world_a, "serving-deployment"))
    assert b'data-testid="scale-form"' in page.content
    assert b'data-testid="key-form"' not in page.content
    assert b'data-testid="keys-table"' not in page.content
    assert key.prefix.encode() not in page.content
    key_create = _url(world_a, "serving-deployment-key-create")
    assert client.post(key_create, {"name": "sneaky"}).status_code == 403
    assert client.post(revoke).status_code == 403

    assert deployment.revisions.count() == 1 and _deployment(world_a).pk == deployment.pk
    assert InferenceKey.objects.filter(deployment=deployment, revoked_at__isnull=True).count() == 1


def test_pages_of_another_tenant_are_404(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    key = InferenceKey.objects.get(deployment=deployment)
    for url in (_url(world_a, "serving-deployments"), _url(world_a, "serving-deployment-status")):
        anonymous = client.get(url)  # not signed in: to the login page
        assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    client.force_login(world_b.owner)
    a, b = world_a.tenant.slug, world_b.tenant.slug
    assert client.get(reverse("serving-deployments", args=[a])).status_code == 404
    assert client.post(reverse("serving-deployments", args=[a]), {"name": "x"}).status_code == 404
    for slug in (a, b):  # A's slug, or B's own slug with A's ids: the same 404
        kwargs = {"slug": slug, "pk": deployment.pk}
        for name in ("serving-deployment", "serving-deployment-status"):
            assert client.get(reverse(name, kwargs=kwargs)).status_code == 404, name
        for name in (
            "serving-deployment-scale",
            "serving-deployment-canary",
            "serving-deployment-traffic",
            "serving-deployment-promote",
            "serving-deployment-delete",
            "serving-deployment-key-create",
        ):
            assert client.post(reverse(name, kwargs=kwargs), {"percent": 1}).status_code == 404
        revoke = reverse("serving-deployment-key-revoke", kwargs={**kwargs, "key_pk": key.pk})
        assert client.post(revoke).status_code == 404
    # B's own deployment with A's key id: also a 404.
    revoke = reverse(
        "serving-deployment-key-revoke",
        kwargs={"slug": b, "pk": _deployment(world_b).pk, "key_pk": key.pk},
    )
    assert client.post(revoke).status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None and deployment.revisions.count() == 1
    assert _deployment(world_a).deleted_at is None


def test_the_deploy_form_shows_engines_and_deploys_on_vllm(
    client: Any, world_a: TenantWorld
) -> None:
    client.force_login(world_a.owner)
    url = _url(world_a, "serving-deployments")
    version = _served_version(world_a)
    page = client.get(url)
    assert f"{version.label} (builtin)" in page.content.decode()  # the engines it may run on
    vllm = {"engine": "vllm", "vllm_dtype": "bfloat16", "vllm_max_num_seqs": 8}
    refused = client.post(url, _create_data(world_a, name="llm", **vllm))
    assert "validated for builtin, not vllm" in _field_block(refused.content, "engine")
    type(version).objects.filter(pk=version.pk).update(engines=["builtin", "vllm"])
    bad = client.post(url, _create_data(world_a, name="llm", **{**vllm, "vllm_max_num_seqs": 0}))
    assert "must be between" in _field_block(bad.content, "vllm_max_num_seqs")
    made = client.post(url, _create_data(world_a, name="llm", **vllm))
    assert made.status_code == 200 and b'data-testid="new-key"' in made.content
    engine = Deployment.objects.get(tenant=world_a.tenant, name="llm").current_revision.engine
    assert engine["name"] == "vllm" and engine["dtype"] == "bfloat16"
    assert engine["max_num_seqs"] == 8
    detail = client.get(_url(world_a, "serving-deployment",
                             Deployment.objects.get(tenant=world_a.tenant, name="llm")))  # fmt: skip
    assert "vLLM" in detail.content.decode() and "bfloat16, 8 seqs" in detail.content.decode()
