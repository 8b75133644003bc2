"""Create (or refresh) the demo tenant, its owner login and the demo's story; print them.

The story, set up so the loop shows itself without anyone typing: a tiny Llama the portal
trains here at first run (serving.engine.tiny_trained, ~10 s each: v1 plain, v2 friendlier
wording) under DATA_DIR/demo-models/, both registered by path and validated synchronously; the
deployment `demo` serving v1 with a signed SLA contract and v2 as a canary at 20%; a saved
drill (`canary-error-burst`, one click on the overview page) whose error burst the contract's
fast rule catches, rolling the canary back and opening an incident; and an inference key of
its own for the `traffic` part of `manage.py up` (DATA_DIR/demo/traffic.json, mode 0600),
which sends steady requests. Creating the deployment enqueues the usual reconcile on commit.
Every step is idempotent: a second run reuses what exists (and puts the canary back once a
drill rolled it back). The deployment's first inference key is printed only when it is
created (the portal keeps its hash, never the key).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from portal.exceptions import PortalError
from tenants import services
from tenants.actors import Actor
from tenants.models import Membership, Role, Tenant

DEMO_EMAIL = "demo@example.com"
DEMO_ORG = "Demo Tenant"
DEMO_MODEL = "demo-llama"
DEMO_LABEL, CANARY_LABEL = "v1", "v2"
CANARY_PERCENT = 20
DEMO_DEPLOYMENT = "demo"
DEMO_SETTINGS: dict[str, Any] = {"num_cpus": 0.25, "num_replicas": 1, "kv_blocks": 64}
DEMO_DRILL = "canary-error-burst"
TRAFFIC_KEY = "demo-traffic"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# Training stops on its loss target (5-10 s on two quiet cores); this bounds a far slower machine.
DEMO_TRAIN_SECONDS = 300.0


DEMO_CONTRACT = """\
# The demo deployment's SLA contract: edit it on the deployment's Contract page.
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: demo-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
    - name: p95-latency
      sli: latency_p95
      threshold_ms: 500
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 10s
      min_requests: 5
      action: rollback
"""


class Command(BaseCommand):
    help = (
        "Create the demo tenant with an owner login and a tiny demo deployment (idempotent) "
        "and print the login and how to call the deployment."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--email", default=os.environ.get("DEMO_EMAIL", DEMO_EMAIL))
        parser.add_argument("--organisation", default=DEMO_ORG)
        parser.add_argument(
            "--no-deployment", action="store_true", help="skip the demo model and deployment"
        )

    def handle(
        self, *args: Any, email: str, organisation: str, no_deployment: bool, **options: Any
    ) -> None:
        password = os.environ.get("DEMO_PASSWORD") or secrets.token_urlsafe(12)
        user_model = get_user_model()
        with transaction.atomic():
            user = user_model.objects.filter(username=email).first()
            if user is None:
                user, tenant = services.signup(
                    email=email, password=password, organisation=organisation
                )
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
                owned = Membership.objects.filter(user=user, role=Role.OWNER).select_related(
                    "tenant"
                )
                membership = owned.first()
                tenant = (
                    membership.tenant
                    if membership
                    else services.tenant_create(
                        owner=user, name=organisation, actor=Actor(user=user)
                    )
                )
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo tenant '{tenant.name}' ({tenant.slug}) is ready.\n"
                f"  Log in at http://127.0.0.1:{os.environ.get('PORT', '8000')}/accounts/login/\n"
                f"  e-mail:   {email}\n"
                f"  password: {password}"
            )
        )
        if not no_deployment:
            self.demo_deployment(tenant, Actor(user=user))

    def demo_deployment(self, tenant: Tenant, actor: Actor) -> None:
        # Imported here: the serving room (and torch, for the checkpoint) only when it is used.
        from serving.deployments import services as deployments
        from serving.deployments.models import Deployment
        from serving.registry import services as serving
        from serving.registry.models import Model, ModelVersion, VersionStatus

        try:
            model = Model.objects.filter(tenant=tenant, name=DEMO_MODEL).first()
            if model is None:
                model = serving.model_create(
                    tenant=tenant,
                    actor=actor,
                    name=DEMO_MODEL,
                    description="Tiny Llama the portal trains at first run: it answers in "
                    "English about what the portal does (v2 in a friendlier tone).",
                )
            versions = {}
            for variant, label in enumerate((DEMO_LABEL, CANARY_LABEL), start=1):
                version = ModelVersion.objects.filter(model=model, label=label).first()
                if version is None:
                    directory = self.demo_checkpoint(
                        Path(settings.DATA_DIR) / "demo-models" / f"llama-{label}", variant
                    )
                    version = serving.version_register_path(
                        tenant=tenant, actor=actor, model=model, label=label, path=str(directory)
                    )
                if not version.is_final:  # new, or a validation that was interrupted
                    version = serving.version_validate(tenant=tenant, version_id=version.pk)
                if version is None or version.status != VersionStatus.READY:
                    reason = version.failure_reason if version is not None else "version is gone"
                    self.stderr.write(
                        f"Demo model {DEMO_MODEL} {label} is not ready ({reason}); no demo."
                    )
                    return
                versions[label] = version
            deployment = Deployment.objects.filter(
                tenant=tenant, name=DEMO_DEPLOYMENT, deleted_at__isnull=True
            ).first()
            key = None
            if deployment is None:
                deployment, key = deployments.deployment_create(
                    tenant=tenant,
                    actor=actor,
                    name=DEMO_DEPLOYMENT,
                    version_id=versions[DEMO_LABEL].pk,
                    description="The demo: v1 stable, v2 as a canary, steady traffic.",
                    settings=dict(DEMO_SETTINGS),
                )
            from serving.ops.contracts import contract_current, contract_set

            if contract_current(tenant=tenant, deployment=deployment) is None:
                # The ops loop watches the demo from the start: its health page has numbers.
                contract_set(
                    tenant=tenant, actor=actor, deployment=deployment, source=DEMO_CONTRACT
                )
            revision = deployment.current_revision
            if (
                revision is not None
                and revision.canary_version_id is None
                and revision.stable_version_id == versions[DEMO_LABEL].pk
            ):
                deployments.deployment_set_canary(
                    tenant=tenant,
                    actor=actor,
                    deployment=deployment,
                    version_id=versions[CANARY_LABEL].pk,
                    percent=CANARY_PERCENT,
                )
            self.demo_drill(tenant, actor, deployment)
            self.traffic_key(tenant, actor, deployment)
        except PortalError as exc:  # e.g. a quota lowered below the demo's needs
            self.stderr.write(f"No demo deployment: {exc}")
            return
        self.print_deployment(tenant, deployment.name, deployment.status, key)

    def demo_drill(self, tenant: Tenant, actor: Actor, deployment: Any) -> None:
        """The drill the overview page runs in one click: half the canary's requests fail
        for a minute; the contract's fast rule rolls the canary back."""
        from incidents import drills
        from incidents.drills.models import ChaosDrill

        if ChaosDrill.objects.filter(tenant=tenant, name=DEMO_DRILL).exists():
            return
        drills.drill_create(
            tenant=tenant,
            actor=actor,
            deployment=deployment,
            name=DEMO_DRILL,
            description="Half of the canary's requests fail with a 503 for a minute. The SLA "
            "contract's fast rule should roll the canary back and open an incident.",
            fault="error_burst",
            group="canary",
            parameters={"status": 503},
            traffic_share=0.5,
            duration_s=60,
        )

    def traffic_key(self, tenant: Tenant, actor: Actor, deployment: Any) -> None:
        """The traffic part's key and target (written once; again if its key was revoked)."""
        from portal.demo_traffic import traffic_file
        from serving.control.cluster import ClusterConfigError, ray_target_from_env
        from serving.deployments import services as deployments
        from serving.deployments.models import InferenceKey

        path = traffic_file(settings.DATA_DIR)
        live = InferenceKey.objects.filter(
            tenant=tenant, deployment=deployment, name=TRAFFIC_KEY, revoked_at__isnull=True
        )
        if path.is_file() and live.exists():
            return
        try:
            serve_url = ray_target_from_env().serve_url
        except ClusterConfigError:
            return
        for old in live:
            deployments.inference_key_revoke(tenant=tenant, actor=actor, key=old)
        _, raw = deployments.inference_key_create(
            tenant=tenant, actor=actor, deployment=deployment, name=TRAFFIC_KEY
        )
        url = f"{serve_url}/{tenant.slug}/{deployment.name}/v1/completions"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"url": url, "key": raw}, out)
        os.replace(partial, path)

    def demo_checkpoint(self, directory: Path, variant: int) -> Path:
        """The trained checkpoint, written once (its checksum is what the version records).
        PORTAL_DEMO_MODEL_CACHE: a folder where trained checkpoints are kept by the trainer's
        digest, so other data folders (other clones, the test suite's runs) copy them."""
        if not all((directory / name).is_file() for name in CHECKPOINT_FILES):
            from serving.engine.tiny_trained import train, trainer_digest

            cache = os.environ.get("PORTAL_DEMO_MODEL_CACHE", "").strip()
            kept = Path(cache) / f"{trainer_digest()}-v{variant}" if cache else None
            if kept is not None and all((kept / name).is_file() for name in CHECKPOINT_FILES):
                shutil.copytree(kept, directory, dirs_exist_ok=True)
            else:
                self.stdout.write(f"Training the demo's tiny Llama ({directory.name}) ...")
                # It stops on its loss target: the same weights however busy the machine is.
                result = train(directory, variant=variant, seconds=DEMO_TRAIN_SECONDS)
                if not result.converged:
                    self.stderr.write(
                        f"The demo's tiny Llama did not reach its loss target in "
                        f"{DEMO_TRAIN_SECONDS:.0f} s ({result.steps} steps): its answers may "
                        "not read as English. Delete the demo's model folder to train again."
                    )
                if kept is not None and result.converged:
                    partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
                    shutil.copytree(directory, partial, dirs_exist_ok=True)
                    with contextlib.suppress(OSError):  # another run kept it first
                        partial.rename(kept)
                    shutil.rmtree(partial, ignore_errors=True)
        return directory.resolve()

    def print_deployment(self, tenant: Tenant, name: str, status: str, key: str | None) -> None:
        from portal.management.commands.up import ray_disabled
        from serving.control.cluster import ClusterConfigError, ray_target_from_env

        try:
            serve_url = ray_target_from_env().serve_url
        except ClusterConfigError as exc:
            self.stderr.write(f"Ray is misconfigured: {exc}")
            return
        url = f"{serve_url}/{tenant.slug}/{name}/v1/completions"
        body = '{"prompt": "Hello", "max_tokens": 8}'
        if key is not None:
            lines = [
                f"Demo deployment '{name}' created (model {DEMO_MODEL} {DEMO_LABEL}).",
                f"  inference key: {key}",
                "  (shown once: the portal keeps only its hash; add keys on the deployment page)",
            ]
            bearer = key
        else:
            lines = [
                f"Demo deployment '{name}' exists (status {status}); its inference key was shown "
                "when it was created (add one on the deployment page)."
            ]
            bearer = "$KEY"
        auth = f"Authorization: Bearer {bearer}"
        auth_arg = shlex.quote(auth) if key is not None else f'"{auth}"'
        lines.append(
            f"  curl -s {url} -H {auth_arg} "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
        )
        if ray_disabled():
            lines.append("  Ray is off (PORTAL_RAY=off): the deployment stays pending.")
        self.stdout.write(self.style.SUCCESS("\n".join(lines)))
