"""Create (or refresh) the demo tenant, its owner login and a tiny demo deployment; print them.

The deployment serves a tiny random Llama checkpoint written under DATA_DIR/demo-models/tiny,
registered by path and validated here, synchronously. Creating it enqueues the usual reconcile
on commit: the Celery worker of `manage.py up` applies it to Ray Serve. Every step is
idempotent; a second run reuses the checkpoint, the version and the deployment. The inference
key is printed only when the deployment is created (the portal keeps its hash, never the key).
"""

from __future__ import annotations

import os
import secrets
import shlex
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
DEMO_MODEL = "demo-tiny"
DEMO_LABEL = "v1"
DEMO_DEPLOYMENT = "demo"
DEMO_SETTINGS: dict[str, Any] = {"num_cpus": 0.25, "num_replicas": 1, "kv_blocks": 64}
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


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
      for: 15s
      min_requests: 10
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

        directory = self.demo_checkpoint(Path(settings.DATA_DIR) / "demo-models" / "tiny")
        try:
            model = Model.objects.filter(tenant=tenant, name=DEMO_MODEL).first()
            if model is None:
                model = serving.model_create(
                    tenant=tenant,
                    actor=actor,
                    name=DEMO_MODEL,
                    description="Tiny random Llama of the demo (answers gibberish, quickly).",
                )
            version = ModelVersion.objects.filter(model=model, label=DEMO_LABEL).first()
            if version is None:
                version = serving.version_register_path(
                    tenant=tenant, actor=actor, model=model, label=DEMO_LABEL, path=str(directory)
                )
            if not version.is_final:  # new, or a validation that was interrupted
                version = serving.version_validate(tenant=tenant, version_id=version.pk)
            if version is None or version.status != VersionStatus.READY:
                reason = version.failure_reason if version is not None else "version is gone"
                self.stderr.write(
                    f"Demo model {DEMO_MODEL} {DEMO_LABEL} is not ready ({reason}); "
                    "no demo deployment."
                )
                return
            deployment = Deployment.objects.filter(
                tenant=tenant, name=DEMO_DEPLOYMENT, deleted_at__isnull=True
            ).first()
            key = None
            if deployment is None:
                deployment, key = deployments.deployment_create(
                    tenant=tenant,
                    actor=actor,
                    name=DEMO_DEPLOYMENT,
                    version_id=version.pk,
                    description="Demo deployment of the tiny model.",
                    settings=dict(DEMO_SETTINGS),
                )
            from serving.ops.contracts import contract_current, contract_set

            if contract_current(tenant=tenant, deployment=deployment) is None:
                # The ops loop watches the demo from the start: its health page has numbers.
                contract_set(
                    tenant=tenant, actor=actor, deployment=deployment, source=DEMO_CONTRACT
                )
        except PortalError as exc:  # e.g. a quota lowered below the demo's needs
            self.stderr.write(f"No demo deployment: {exc}")
            return
        self.print_deployment(tenant, deployment.name, deployment.status, key)

    def demo_checkpoint(self, directory: Path) -> Path:
        """The tiny checkpoint, written once (its checksum is what the version records)."""
        if not all((directory / name).is_file() for name in CHECKPOINT_FILES):
            from serving.engine.testing import write_tiny_checkpoint

            write_tiny_checkpoint(directory)
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
