"""Schema-driven fuzzing of the API (schemathesis) with two tenants' tokens: no response is a
5xx, and no response carries the other tenant's data.

Every operation of /api/v1/schema/ runs against the Django WSGI app in this process (so it
sees the test transaction), once with Acme's token looking for Globex's data and once the other
way round; then a short stateful run follows the links schemathesis infers from the schema.
Path parameters, FK-like body fields and filters draw from both tenants' real ids as well as
from the generated values, so the fuzzer asks for the other tenant's objects on purpose.

No operation is excluded; what could reach beyond the database stays put:
- webhook and e-mail deliveries (notification channels with fuzzed URLs), invitation mails,
  drill runs (their advance task), rollbacks, Ray reconciles and version validation are all
  enqueued with `transaction.on_commit`, which never fires inside the test transaction, so
  nothing loops or posts (and test e-mail goes to the locmem backend); as a fence, any name
  lookup or socket to a non-loopback address fails the test (`_no_egress`);
- uploads are capped at 1 MiB into a temporary store (the generated bodies are small anyway);
- the acting token and its owner's membership are kept out of the id pools, so a fuzzed
  revoke or removal cannot end the run early (other tokens and members are fair game).
Deeper run by hand: PORTAL_FUZZ_EXAMPLES=100 pytest tests/reliability/test_api_fuzz.py
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.apps import apps
from django.contrib.auth.models import User
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, connection, models, transaction
from django.test import Client
from django.urls import resolve
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.generation.stateful import run_state_machine_as_test

from portal import netguard
from serving.deployments.models import Deployment
from serving.deployments.services import inference_key_create
from tenants import services as tenant_services
from tenants.actors import Actor
from tenants.models import ApiToken, Membership, Role, Tenant
from tests.api_routes import OBJECT_FACTORIES, object_of
from tests.conftest import PASSWORD, TenantWorld, make_world

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(600)]

SCHEMA_PATH = "/api/v1/schema/"
# Each table's ids start at its own multiple of this, so an id names its table: an integer in
# an id field equal to one of the other tenant's ids is that very row, never a coincidence.
ID_STRIDE = 10_000_000
# Per operation and token, sized for the quick suite (about a minute on two cores).
EXAMPLES_PER_OPERATION = int(os.environ.get("PORTAL_FUZZ_EXAMPLES", "10"))
STATEFUL_SCENARIOS = 2 * EXAMPLES_PER_OPERATION
STATEFUL_STEPS = 6
FUZZ_SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],  # no shrinking: a failure
    # prints its request (curl) and that is enough to reproduce it
    suppress_health_check=list(hypothesis.HealthCheck),
)
# The upload endpoints take a raw tar or tar.gz body: sent as opaque bytes, like octet-stream.
schemathesis.serializer.alias(["application/x-tar", "application/gzip"], "application/octet-stream")


# --- one tenant's footprint: what must never appear in the other tenant's responses ----------


@dataclass
class Footprint:
    tenant: Tenant
    strings: tuple[str, ...]
    ids: frozenset[int]
    # Model -> lookup values of this tenant's rows (ids; slugs for tenants).
    objects: dict[type[models.Model], list[Any]] = field(default_factory=dict)


def _tenant_owned_models() -> list[type[models.Model]]:
    return [
        m
        for m in apps.get_models()
        if any(f.name == "tenant" and f.is_relation for f in m._meta.fields)
    ]


def footprint(world: TenantWorld) -> Footprint:
    tenant = world.tenant
    objects: dict[type[models.Model], list[Any]] = {}
    for model in _tenant_owned_models():
        objects[model] = list(model.objects.filter(tenant=tenant).values_list("pk", flat=True))
    users = list(Membership.objects.filter(tenant=tenant).values_list("user_id", flat=True))
    objects[User] = users
    objects[Tenant] = [tenant.pk]
    emails = list(User.objects.filter(pk__in=users).values_list("email", flat=True))
    prefixes = [
        *ApiToken.objects.filter(tenant=tenant).values_list("prefix", flat=True),
        *apps.get_model("serving", "InferenceKey")
        .objects.filter(tenant=tenant)
        .values_list("prefix", flat=True),
    ]
    ids = frozenset(pk for pks in objects.values() for pk in pks)
    strings = (tenant.slug, tenant.name, *emails, *prefixes, f"{tenant.slug}.example")
    return Footprint(tenant=tenant, strings=strings, ids=ids, objects=objects)


# --- finding the other tenant's data in a response -----------------------------------------------


@cache
def _reference_names() -> frozenset[str]:
    """Field names that hold a row id: every FK/one-to-one field name of every model."""
    return frozenset(
        f.name for m in apps.get_models() for f in m._meta.fields if f.many_to_one or f.one_to_one
    )


def _is_id_field(key: str) -> bool:
    return key == "id" or key.endswith(("_id", "_ids", "_pk")) or key in _reference_names()


def _ints(value: Any) -> Iterator[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, str) and value.isdigit():
        yield int(value)
    elif isinstance(value, list):
        for item in value:
            yield from _ints(item)


def _referenced_ids(data: Any) -> Iterator[tuple[str, int]]:
    if isinstance(data, dict):
        for key, value in data.items():
            if _is_id_field(str(key)):
                for number in _ints(value):
                    yield str(key), number
            if isinstance(value, dict | list):
                yield from _referenced_ids(value)
    elif isinstance(data, list):
        for item in data:
            yield from _referenced_ids(item)


def foreign_data_in(body: bytes, other: Footprint) -> list[str]:
    """What of `other` tenant's data the body carries: its strings anywhere, its row ids in
    id-like fields (matching small integers elsewhere would only find coincidences)."""
    text = body.decode("utf-8", "replace")
    found = [f"string {s!r}" for s in other.strings if s and s.lower() in text.lower()]
    try:
        data = json.loads(text)
    except ValueError:
        return found
    found += [f"{key}={pk}" for key, pk in _referenced_ids(data) if pk in other.ids]
    return found


# --- the run: who acts, whose data must stay out, the pools of real ids ---------------------------


@dataclass
class Run:
    actor: TenantWorld
    other_world: TenantWorld
    mine: Footprint
    other: Footprint
    protected: frozenset[int]  # the acting token and its owner: revoking them ends the run early

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.actor.raw_token}"}

    def pool(self, model: type[models.Model] | None) -> list[Any]:
        if model is None:
            return []
        values = self.mine.objects.get(model, []) + self.other.objects.get(model, [])
        if model is Tenant:
            return [self.mine.tenant.slug, self.other.tenant.slug]
        return [v for v in values if v not in self.protected]


@cache
def _path_models(path: str) -> dict[str, type[models.Model] | None]:
    """The model behind each path parameter of an operation, read from the URL conf."""
    names = re.findall(r"\{(\w+)\}", path)
    try:
        match = resolve(re.sub(r"\{\w+\}", "1", path))
    except Exception:  # a path the URL conf cannot resolve: no pools, generated values only
        return {}
    view = getattr(match.func, "cls", None)
    queryset = getattr(view, "queryset", None)
    model = queryset.model if queryset is not None else None
    lookup = getattr(view, "lookup_url_kwarg", None) or getattr(view, "lookup_field", "pk")
    parents = getattr(view, "parent_lookups", {})
    found: dict[str, type[models.Model] | None] = {}
    for name in names:
        if name in parents and model is not None:
            attribute = parents[name].removesuffix("_id")
            found[name] = model._meta.get_field(attribute).related_model  # type: ignore[assignment]
        elif name in ("id", lookup):
            found[name] = model
    return found


@cache
def _reference_targets() -> dict[str, type[models.Model]]:
    """Field name -> the model it points at: every FK field's name, and its last word too
    (`stable_version` also gives `version`, the name request bodies use); first one wins."""
    targets: dict[str, type[models.Model]] = {}
    fields = [
        f
        for m in apps.get_models()
        for f in m._meta.fields
        if (f.many_to_one or f.one_to_one) and f.related_model is not None
    ]
    for f in fields:
        targets.setdefault(f.name, f.related_model)  # type: ignore[arg-type]
    for f in fields:
        targets.setdefault(f.name.rsplit("_", 1)[-1], f.related_model)  # type: ignore[arg-type]
    return targets


def _reference_models(values: Any) -> dict[str, Any]:
    """Fields of a query or JSON body that name a row (`deployment`, `version_id`, ...)."""
    if not isinstance(values, dict):
        return {}
    targets = _reference_targets()
    return {k: targets.get(str(k).removesuffix("_id")) for k in values}


def _with_real_ids(run: Run, values: dict[str, Any], model_of: dict[str, Any]) -> Any:
    if not isinstance(values, dict) or not values:
        return st.just(values)
    drawn: dict[str, Any] = {}
    for key, value in values.items():
        pool = run.pool(model_of.get(key))
        drawn[key] = st.sampled_from([*pool, value]) if pool else st.just(value)
    return st.fixed_dictionaries(drawn)


def load_schema(run: Run) -> Any:
    # A copy: schemathesis writes the links it infers into the dict it is given.
    schema = schemathesis.openapi.from_dict(copy.deepcopy(_raw_schema()))
    schema.app = _wsgi_app()
    schema.location = SCHEMA_PATH
    schema.config.generation.update(max_examples=EXAMPLES_PER_OPERATION, deterministic=True)

    def flatmap_path_parameters(ctx: Any, path_parameters: Any) -> Any:
        return _with_real_ids(run, path_parameters, _path_models(ctx.operation.path))

    def flatmap_query(ctx: Any, query: Any) -> Any:
        return _with_real_ids(run, query, _reference_models(query))

    def flatmap_body(ctx: Any, body: Any) -> Any:
        return _with_real_ids(run, body, _reference_models(body))

    for hook in (flatmap_path_parameters, flatmap_query, flatmap_body):
        schema.hook(hook)
    return schema


@cache
def _wsgi_app() -> Any:
    return get_wsgi_application()


@cache
def _raw_schema() -> dict[str, Any]:
    response = Client().get(SCHEMA_PATH, HTTP_ACCEPT="application/json")
    assert response.status_code == 200, response.status_code
    return json.loads(response.content)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def _ids_name_their_table(db: Any) -> None:
    """Move every table's id sequence up into its own window [n * ID_STRIDE, (n + 1) * ID_STRIDE)
    (sequences only ever go up: ids stay unique across tests, as in-process caches keyed by id
    expect; setval is not transactional, so this outlives the test, harmlessly)."""
    tables = sorted(
        {
            m._meta.db_table
            for m in apps.get_models(include_auto_created=True)
            if isinstance(m._meta.pk, models.AutoField)
        }
    )
    with connection.cursor() as cursor:
        for index, table in enumerate(tables, start=1):
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            row = cursor.fetchone()
            if row is None or row[0] is None:
                continue
            next_value = "CASE WHEN is_called THEN last_value + 1 ELSE last_value END"
            cursor.execute(
                f"SELECT setval(%s, GREATEST(%s, {next_value}), false) FROM {row[0]}",  # noqa: S608 (a name from pg_get_serial_sequence)
                [row[0], index * ID_STRIDE],
            )


def _populate(world: TenantWorld) -> None:
    """One object of every kind the API exposes, an inference key and a pending invitation;
    the rate limit raised so the fuzzer is not answered 429 after 20 requests."""
    for label in OBJECT_FACTORIES:
        object_of(label, world)
    owner = Actor(user=world.owner)
    deployment = Deployment.objects.filter(tenant=world.tenant).order_by("id").first()
    assert deployment is not None
    inference_key_create(tenant=world.tenant, actor=owner, deployment=deployment, name="app")
    tenant_services.invitation_create(
        tenant=world.tenant, actor=owner, email=f"pending@{world.tenant.slug}.example",
        role=Role.VIEWER,
    )  # fmt: skip
    tenant_services.api_token_create(
        tenant=world.tenant, actor=owner, name="spare", scopes=["read"]
    )
    staff = User.objects.filter(username="staff@platform.example").first() or (
        User.objects.create_user(
            username="staff@platform.example", email="staff@platform.example",
            password=PASSWORD, is_staff=True,
        )
    )  # fmt: skip
    tenant_services.quota_update(
        tenant=world.tenant, actor=Actor(user=staff), changes={"requests_per_second": 100_000}
    )


@pytest.fixture
def worlds(
    _ids_name_their_table: None, settings: Any, tmp_path: Any
) -> tuple[TenantWorld, TenantWorld]:
    settings.ARTIFACT_STORE_DIR = str(tmp_path / "artifacts")
    settings.ARTIFACT_UPLOAD_MAX_BYTES = 1024 * 1024
    acme, globex = make_world("Acme"), make_world("Globex")
    _populate(acme)
    _populate(globex)
    return acme, globex


_LOOPBACK_NAMES = {"localhost", "testserver"}


def _is_loopback(host: Any) -> bool:
    if host is None or host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _no_egress(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fuzzed webhook URLs and the like must not be reached: any name lookup or connection to a
    non-loopback address is refused and recorded, and the test fails if there was one."""
    attempts: list[str] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback(host):
            attempts.append(f"lookup {host}")
            raise socket.gaierror(socket.EAI_NONAME, "egress refused by the fuzz test")
        return real_getaddrinfo(host, *args, **kwargs)

    def refused(sock: socket.socket, address: Any) -> bool:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            attempts.append(f"connect {address}")
            return True
        return False

    def connect(sock: socket.socket, address: Any) -> None:
        if refused(sock, address):
            raise ConnectionRefusedError("egress refused by the fuzz test")
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        if refused(sock, address):
            return 111  # ECONNREFUSED
        return real_connect_ex(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    # Channel creation resolves webhook hosts: answered here, never by DNS (nothing is sent).
    monkeypatch.setattr(netguard, "resolve", lambda host, port: ["127.0.0.1"])
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield attempts
    assert attempts == [], f"the API tried to reach the network: {attempts}"


@pytest.fixture(params=["acme-token", "globex-token"])
def run(request: pytest.FixtureRequest, worlds: tuple[TenantWorld, TenantWorld]) -> Run:
    acme, globex = worlds
    actor, other = (acme, globex) if request.param == "acme-token" else (globex, acme)
    owner_membership = Membership.objects.get(tenant=actor.tenant, user=actor.owner)
    return Run(
        actor=actor,
        other_world=other,
        mine=footprint(actor),
        other=footprint(other),
        protected=frozenset({actor.token.pk, owner_membership.pk, actor.owner.pk}),
    )


@pytest.fixture
def api_schema(run: Run) -> Any:
    return load_schema(run)


# --- checks and the call -------------------------------------------------------------------------


def _no_foreign_data(run: Run) -> Any:
    def no_foreign_data(ctx: Any, response: Any, case: Any) -> None:
        leaked = foreign_data_in(response.content or b"", run.other)
        if leaked:
            raise AssertionError(
                f"{case.method} {case.formatted_path} as {run.mine.tenant.slug} returned "
                f"{run.other.tenant.slug}'s data: {', '.join(leaked)}"
            )

    return no_foreign_data


def call_in_savepoint(case: Any, headers: dict[str, str]) -> Any:
    """Call the app inside a savepoint and roll a 5xx back: in production each request has its
    own transaction, so a failed one must not poison the requests after it here. Django closes
    a connection that is inside a transaction when a request starts (close_old_connections);
    the test client unhooks that for its requests, and so does this."""
    unhooked = [
        signal
        for signal in (signals.request_started, signals.request_finished)
        if signal.disconnect(close_old_connections)
    ]
    sid = transaction.savepoint()
    try:
        response = case.call(headers=headers)
    finally:
        for signal in unhooked:
            signal.connect(close_old_connections)
    if response.status_code >= 500:
        transaction.savepoint_rollback(sid)
    else:
        transaction.savepoint_commit(sid)
    return response


def _strategy(operation: Any) -> Any:
    """Valid and invalid requests (schemathesis' positive and negative generation modes)."""
    return st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )


def test_every_operation(api_schema: Any, run: Run, subtests: pytest.Subtests) -> None:
    # schemathesis' own `from_fixture(...).parametrize()` needs pytest < 9.2 (it sets a node
    # attribute pytest 9.2 removed), so the operations are walked here, one subtest each.
    checks = [not_a_server_error, _no_foreign_data(run)]
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 50, "the schema lost its operations"
    for operation in operations:
        with subtests.test(operation.label):

            @FUZZ_SETTINGS
            @hypothesis.given(case=_strategy(operation))
            def fuzz(case: Any) -> None:
                response = call_in_savepoint(case, run.headers)
                case.validate_response(response, checks=checks, headers=run.headers)

            # Each operation starts from the same two worlds: a DELETE early in the list must
            # not leave the operations after it nothing to work on.
            sid = transaction.savepoint()
            try:
                fuzz()
            finally:
                transaction.savepoint_rollback(sid)


def _hostile_cases(run: Run) -> list[tuple[str, str, Any, int, str]]:
    """The hostile-tenant suite's attack routes, as schemathesis cases: (method, path, body,
    the status, the field the error must name)."""
    deployment = Deployment.objects.get(tenant=run.actor.tenant, name="assistant")
    drill = {
        "deployment": deployment.pk,
        "group": "stable",
        "duration_s": 10,
        "steady_state": {"contract": False, "probes": [{"sli": "error_rate", "max": 0.5}]},
    }
    webhook = {"kind": "webhook", "name": "hostile"}
    return [
        ("POST", "/api/v1/notification-channels/",
         {**webhook, "url": "http://169.254.169.254/latest/meta-data/"}, 400, "url"),
        ("POST", "/api/v1/notification-channels/",
         {**webhook, "url": "http://[::ffff:127.0.0.1]:6379/"}, 400, "url"),
        ("POST", "/api/v1/notification-channels/",
         {**webhook, "url": "http://2130706433/"}, 400, "url"),
        ("POST", "/api/v1/drills/",
         {**drill, "name": "delay", "fault": "control_plane_delay"}, 403, "fault"),
        ("POST", "/api/v1/drills/",
         {**drill, "name": "leak", "fault": "gpu_memory_leak",
          "parameters": {"max_mb": 1_000_000}}, 400, "parameters.max_mb"),
        ("POST", "/api/v1/drills/",
         {**drill, "name": "flood", "fault": "token_starvation",
          "parameters": {"concurrency": 64}}, 400, "parameters.concurrency"),
        ("POST", "/api/v1/deployments/",
         {"name": "assistant", "version": deployment.current_revision.stable_version_id}, 409,
         "name"),
    ]  # fmt: skip


def test_the_hostile_tenants_attacks_are_refused_naming_the_field(
    api_schema: Any, run: Run, settings: Any
) -> None:
    """The attack routes go through schemathesis too: a clear 4xx naming the field, no 5xx, no
    neighbour's data, a response that matches the schema."""
    settings.WEBHOOK_ALLOWED_NETWORKS = []  # the platform's default
    checks = [not_a_server_error, _no_foreign_data(run)]
    for method, path, body, status, name in _hostile_cases(run):
        case = api_schema[path][method].Case(body=body, media_type="application/json")
        response = call_in_savepoint(case, run.headers)
        case.validate_response(response, checks=checks, headers=run.headers)
        error = response.json()["error"]
        assert response.status_code == status, (path, body, error)
        assert name in error["fields"] or name in error["message"], (path, error)


def test_the_leak_check_sees_the_other_tenant(run: Run) -> None:
    """The detector itself: the other tenant's own listings are full of its data, and the
    acting tenant's are clean of it."""
    client = Client()
    for path in ("/api/v1/deployments/", "/api/v1/members/", "/api/v1/tokens/"):
        mine = client.get(path, HTTP_AUTHORIZATION=run.headers["Authorization"])
        theirs = client.get(path, HTTP_AUTHORIZATION=f"Bearer {run.other_world.raw_token}")
        assert mine.status_code == theirs.status_code == 200, path
        assert foreign_data_in(mine.content, run.other) == [], path
        assert foreign_data_in(theirs.content, run.other), path


# --- stateful: sequences along the links schemathesis infers (drf-spectacular declares none) -----


def test_the_schema_has_inferred_links() -> None:
    """drf-spectacular emits no OpenAPI links; schemathesis infers them (dependency analysis),
    so the stateful run below has transitions to follow."""
    api_schema = schemathesis.openapi.from_dict(copy.deepcopy(_raw_schema()))
    assert not any(
        "links" in response
        for item in _raw_schema()["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict)
        for response in operation.get("responses", {}).values()
    )
    api_schema.as_state_machine()
    assert api_schema.statistic.transitions.total > 0


def test_stateful_sequences(api_schema: Any, run: Run) -> None:
    checks = [not_a_server_error, _no_foreign_data(run)]

    class Sequences(api_schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:  # each scenario starts from the same two worlds
            self.sid = transaction.savepoint()

        def teardown(self) -> None:
            transaction.savepoint_rollback(self.sid)

        def call(self, case: Any, **kwargs: Any) -> Any:
            return call_in_savepoint(case, run.headers)

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=checks, headers=run.headers)

    run_state_machine_as_test(
        Sequences,
        settings=hypothesis.settings(
            FUZZ_SETTINGS, max_examples=STATEFUL_SCENARIOS, stateful_step_count=STATEFUL_STEPS
        ),
    )
