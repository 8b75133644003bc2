"""The deployment playground page without Ray: a small HTTP server on 127.0.0.1 stands in for
the Serve proxy (as in test_health_tick) and answers like the router (x-ab-group,
x-model-version, x-request-id, traceparent). Roles, foreign tenants, bounds and the throttle."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.urls import reverse

from serving.deployments import services as deploy
from serving.deployments.keys import probe_key
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops.playground import version_label
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import _version

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


class _Router(BaseHTTPRequestHandler):
    """A stand-in for the Serve proxy and the deployment's router: answers the slot that
    `x-ab-group` asks for (or `answer_group` when set), with that slot's version."""

    versions: dict[str, str] = {}
    seen: list[dict[str, Any]] = []
    text = "a reply"
    status = 200
    delay_s = 0.0
    answer_group: str | None = None
    barrier: threading.Barrier | None = None

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.seen.append({"path": self.path, "headers": headers, "body": body})
        number = len(self.seen)
        if self.barrier is not None:  # both arms must be in flight at once to pass
            self.barrier.wait()
        time.sleep(self.delay_s)
        group = self.answer_group or headers.get("x-ab-group", "stable")
        if self.status == 200:
            if "messages" in body:
                choice = {"message": {"role": "assistant", "content": self.text}}
            else:
                choice = {"text": self.text}
            payload = {
                "choices": [{"index": 0, **choice, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]},
            }
        else:
            payload = {"error": {"code": "prompt_too_long", "message": "too long for me"}}
        raw = json.dumps(payload).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.send_header("x-ab-group", group)
        self.send_header("x-model-version", self.versions.get(group, ""))
        self.send_header("x-request-id", f"req-{number}")
        self.send_header("traceparent", f"00-{number:032x}-{number:016x}-01")
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    _Router.versions, _Router.seen, _Router.text, _Router.status = {}, [], "a reply", 200
    _Router.delay_s, _Router.answer_group, _Router.barrier = 0.0, None, None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # The portal's configured cluster (ray_target_from_env): the only place the page sends to.
    for name, value in {
        "RAY_ADDRESS": "127.0.0.1:1",
        "RAY_DASHBOARD_URL": "http://127.0.0.1:1",
        "RAY_AUTH_TOKEN": "t",
        "RAY_SERVE_URL": url,
    }.items():
        monkeypatch.setenv(name, value)
    yield url
    server.shutdown()
    server.server_close()


def _serving(world: TenantWorld, *, canary: bool = False, **changes: Any) -> Deployment:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    if canary:
        changes["canary_version"] = _version(world, "v2").pk
        changes["canary_percent"] = 10
    if changes:
        deploy.deployment_change(
            tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
            changes=changes, reason="playground test",
        )  # fmt: skip
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    deployment = Deployment.objects.select_related(
        "current_revision__stable_version__model", "current_revision__canary_version__model"
    ).get(pk=deployment.pk)
    revision = deployment.current_revision
    _Router.versions = {
        "stable": version_label(revision.stable_version),
        "canary": version_label(revision.canary_version),
    }
    return deployment


def _url(world: TenantWorld, deployment: Deployment) -> str:
    return reverse(
        "serving-deployment-playground", kwargs={"slug": world.tenant.slug, "pk": deployment.pk}
    )


def _post(client: Any, url: str, **fields: Any) -> Any:
    data = {"kind": "completion", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    data.update(fields)
    return client.post(url, data, **HTMX)


def _answers(page: str) -> list[dict[str, str]]:
    pattern = re.compile(
        r'data-testid="playground-answer" data-arm="(\w*)" data-group="(\w*)" '
        r'data-version="([^"]*)" data-status="(\d*)"'
    )
    return [
        {"arm": m[0], "group": m[1], "version": m[2], "status": m[3]} for m in pattern.findall(page)
    ]


def _field_errors(page: str) -> dict[str, str]:
    found = re.findall(r'data-testid="playground-error" data-field="(\w+)">(.*?)</ul>', page, re.S)
    return dict(found)


def test_both_slots_answer_side_by_side_through_the_proxy(
    client: Any, world_a: TenantWorld, serve_proxy: str
) -> None:
    deployment = _serving(world_a, canary=True)
    client.force_login(world_a.operator)
    url = _url(world_a, deployment)
    page = client.get(url)
    assert page.status_code == 200 and 'data-testid="playground-form"' in page.content.decode()
    assert f'hx-post="{url}"' in page.content.decode()
    _Router.barrier = threading.Barrier(2, timeout=5)  # sequential calls would time out
    response = _post(client, url, arm="both", max_tokens=5, temperature=0.7)
    assert response.status_code == 200
    page_text = response.content.decode()
    answers = _answers(page_text)
    assert [(a["arm"], a["group"], a["status"]) for a in answers] == [
        ("stable", "stable", "200"), ("canary", "canary", "200")
    ]  # fmt: skip
    assert answers[0]["version"] == _Router.versions["stable"]
    assert answers[1]["version"] == _Router.versions["canary"] != answers[0]["version"]
    for number in (1, 2):  # each reply's own ids
        assert f"<code>req-{number}</code>" in page_text
        assert f"<code>00-{number:032x}-{number:016x}-01</code>" in page_text
    assert "3 in, 5 out" in page_text and "a reply" in page_text
    # What went to the router: the probe key, the slot pinned, no client key.
    assert sorted(r["headers"]["x-ab-group"] for r in _Router.seen) == ["canary", "stable"]
    for request in _Router.seen:
        assert request["path"] == f"/{world_a.tenant.slug}/assistant/v1/completions"
        assert request["headers"]["authorization"] == f"Bearer {probe_key(deployment.pk)}"
        assert "x-client-key" not in request["headers"] and "user" not in request["body"]
        assert request["body"] == {"prompt": "Hello", "max_tokens": 5, "temperature": 0.7}
    assert probe_key(deployment.pk) not in page_text  # the key never reaches the page


def test_chat_on_one_slot_and_the_answer_is_escaped(
    client: Any, world_a: TenantWorld, serve_proxy: str
) -> None:
    deployment = _serving(world_a, canary=True)
    client.force_login(world_a.operator)
    _Router.text = "<script>alert(1)</script>"
    response = _post(client, _url(world_a, deployment), kind="chat", arm="canary")
    page = response.content.decode()
    assert [a["group"] for a in _answers(page)] == ["canary"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    (request,) = _Router.seen
    assert request["path"].endswith("/v1/chat/completions")
    assert request["body"]["messages"] == [{"role": "user", "content": "Hello"}]


def test_a_plain_post_gets_the_whole_page(
    client: Any, world_a: TenantWorld, serve_proxy: str
) -> None:
    deployment = _serving(world_a)
    client.force_login(world_a.owner)
    data = {"kind": "completion", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    response = client.post(_url(world_a, deployment), {**data, "arm": "stable"})
    page = response.content.decode()
    assert response.status_code == 200 and 'data-testid="playground-heading"' in page
    assert [a["group"] for a in _answers(page)] == ["stable"]


def test_a_fallback_refusal_and_a_timeout_are_shown(
    client: Any, world_a: TenantWorld, serve_proxy: str, settings: Any
) -> None:
    deployment = _serving(world_a, canary=True)
    client.force_login(world_a.operator)
    url = _url(world_a, deployment)
    _Router.answer_group = "stable"  # e.g. the canary's breaker is open
    page = _post(client, url, arm="canary").content.decode()
    assert 'data-testid="playground-unpinned"' in page
    _Router.answer_group, _Router.status = None, 400
    page = _post(client, url, arm="stable").content.decode()
    assert _answers(page)[0]["status"] == "400"
    assert "prompt_too_long: too long for me" in page
    _Router.status, _Router.delay_s = 200, 1.5
    settings.PLAYGROUND_TIMEOUT_S = 0.3
    page = _post(client, url, arm="stable").content.decode()
    assert "no answer within 0.3 s" in page and _answers(page)[0]["status"] == ""


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"prompt": ""}, "prompt", "Write a prompt."),
        ({"prompt": "   "}, "prompt", "write a prompt."),
        ({"prompt": "x" * 51}, "prompt", "at most 50 characters"),
        ({"max_tokens": 9}, "max_tokens", "from 1 to 8"),
        ({"max_tokens": 0}, "max_tokens", "from 1 to 8"),
        ({"temperature": 3}, "temperature", "from 0 to 2"),
        ({"arm": "both"}, "arm", "has no canary"),
        ({"arm": "canary"}, "arm", "has no canary"),
        ({"arm": "green"}, "arm", "green"),
        ({"kind": "embedding"}, "kind", "embedding"),
    ],
)
def test_bad_input_names_its_field_and_sends_nothing(
    client: Any,
    world_a: TenantWorld,
    serve_proxy: str,
    fields: dict[str, Any],
    field: str,
    message: str,
) -> None:
    # The deployment's guard lowers the portal's bounds.
    deployment = _serving(world_a, guard={"max_prompt_tokens": 50, "max_tokens": 8})
    client.force_login(world_a.operator)
    response = _post(client, _url(world_a, deployment), **{"arm": "stable", **fields})
    errors = _field_errors(response.content.decode())
    assert list(errors) == [field] and message in errors[field], errors
    assert _Router.seen == []
    # Without htmx the status says it too.
    data = {"kind": "completion", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    plain = client.post(_url(world_a, deployment), {**data, "arm": "stable", **fields})
    assert plain.status_code == 400


def test_a_deployment_that_is_not_serving_is_refused_on_arm(
    client: Any, world_a: TenantWorld, serve_proxy: str
) -> None:
    deployment = _serving(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.FAILED)
    client.force_login(world_a.operator)
    errors = _field_errors(_post(client, _url(world_a, deployment), arm="stable").content.decode())
    assert list(errors) == ["arm"] and "is not serving (status Failed)" in errors["arm"]
    assert (
        'data-testid="playground-not-serving"'
        in client.get(_url(world_a, deployment)).content.decode()
    )
    assert _Router.seen == []


def test_without_a_configured_cluster_the_page_says_so(
    client: Any, world_a: TenantWorld, serve_proxy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _serving(world_a)
    monkeypatch.delenv("RAY_DASHBOARD_URL")  # RAY_ADDRESS alone is a broken configuration
    client.force_login(world_a.operator)
    url = _url(world_a, deployment)
    page = _post(client, url, arm="stable").content.decode()
    assert 'data-testid="playground-errors"' in page and "No Serve proxy is configured" in page
    data = {"kind": "completion", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    assert client.post(url, {**data, "arm": "stable"}).status_code == 503
    assert _Router.seen == []


def test_viewers_anonymous_and_other_tenants_are_refused(
    client: Any, world_a: TenantWorld, world_b: TenantWorld, serve_proxy: str
) -> None:
    deployment = _serving(world_a)
    url = _url(world_a, deployment)
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(world_a.viewer)
    assert client.get(url).status_code == 403
    assert _post(client, url, arm="stable").status_code == 403
    # Another tenant's member: a 404 under either tenant's slug.
    client.force_login(world_b.operator)
    assert client.get(url).status_code == 404
    foreign = reverse(
        "serving-deployment-playground", kwargs={"slug": world_b.tenant.slug, "pk": deployment.pk}
    )
    assert client.get(foreign).status_code == 404
    assert _post(client, foreign, arm="stable").status_code == 404
    assert _Router.seen == []


def test_runs_are_throttled_per_user(
    client: Any, world_a: TenantWorld, serve_proxy: str, settings: Any
) -> None:
    settings.PLAYGROUND_PER_MINUTE = 2
    deployment = _serving(world_a)
    url = _url(world_a, deployment)
    client.force_login(world_a.operator)
    for _ in range(2):
        assert _answers(_post(client, url, arm="stable").content.decode())
    page = _post(client, url, arm="stable").content.decode()
    assert "Too many playground runs" in page and not _answers(page)
    data = {"kind": "completion", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    assert client.post(url, {**data, "arm": "stable"}).status_code == 429
    assert len(_Router.seen) == 2
    # Another user of the tenant has a bucket of their own.
    client.force_login(world_a.owner)
    assert _answers(_post(client, url, arm="stable").content.decode())
