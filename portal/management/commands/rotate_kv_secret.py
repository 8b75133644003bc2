"""`manage.py rotate_kv_secret`: a new KV secret (prefix-cache salts, probe keys), then one
forced reconcile so every live deployment gets the new salts and probe key hashes.

The previous secret stays accepted for probe keys until `--end-grace` (or the next rotation),
so health probes pass while the reconcile lands; `--no-grace` revokes it at once (a leaked
secret: probes fail until the reconcile has landed). Cache salts use only the new secret.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from portal import secrets

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Rotate the KV secret (prefix-cache salts and probe keys) and reconcile every live "
        "deployment; the previous secret stays valid for probes until --end-grace."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--no-grace",
            action="store_true",
            help="do not keep the previous secret (it leaked): probes fail until the reconcile",
        )
        mode.add_argument(
            "--end-grace",
            action="store_true",
            help="no new secret: stop accepting the previous one (after the reconcile landed)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            if opts["end_grace"]:
                state = secrets.kv_end_grace()
                done = "the previous KV secret is no longer accepted"
            else:
                state = secrets.kv_rotate(keep_previous=not opts["no_grace"])
                done = "KV secret rotated" + (
                    "; the previous one stays valid for probe keys until --end-grace"
                    if state.previous
                    else "; the previous one is revoked"
                )
        except secrets.SecretNotRotatable as exc:
            raise CommandError(str(exc)) from exc
        logger.warning("%s (%s)", done, secrets.kv_secret_file())
        self.stdout.write(f"{done} ({secrets.kv_secret_file()}).")
        self.enqueue_reconcile()

    def enqueue_reconcile(self) -> None:
        """Forced: every router and pool gets the new salts and probe key hashes."""
        from serving.deployments.reconcile import has_deployments
        from serving.deployments.tasks import reconcile

        if not has_deployments() and settings.GPU_AGENT_MODE != "ray":
            self.stdout.write("No deployments: nothing to reconcile.")
            return
        try:
            reconcile.delay(force=True)
        except Exception as exc:  # the secret has rotated already; say how to finish
            raise CommandError(
                f"The KV secret rotated, but no reconcile could be enqueued ({exc}). Probes keep "
                "passing under the previous secret; the next reconcile applies the new one "
                "(`manage.py shell -c 'from serving.tasks import reconcile; "
                "reconcile.delay(force=True)'`). Do not end the grace before it has run."
            ) from exc
        self.stdout.write("Reconcile of every live deployment enqueued.")
