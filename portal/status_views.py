"""The platform status page (staff only): the readiness checks of `/readyz`, beat's last tick
and each Celery queue's workers with the age of their heartbeat (portal.heartbeats), and the
fleet (portal.fleet): nodes, GPU agents, deployments by state, reconcile runs, drift."""

from __future__ import annotations

import json

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal import fleet, health_urls, heartbeats
from portal.celery import QUEUES


@staff_member_required
def platform_status(request: HttpRequest) -> HttpResponse:
    ready = json.loads(health_urls.readyz(request).content)
    beats = heartbeats.snapshot(QUEUES)
    context = {"ready": ready, "beats": beats, "fleet": fleet.fleet()}
    return render(request, "platform_status.html", context)
