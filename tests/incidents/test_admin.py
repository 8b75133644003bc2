"""Platform staff see the incidents room in the admin, read-only, without channel secrets."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from incidents.notifications.models import NotificationChannel
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, cause_rule_for_world, channel_for_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    user = User.objects.create_superuser("sre@platform.example", "sre@platform.example", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "name",
    ["incident", "incidentevent", "slabreach", "causerule", "notificationchannel",
     "notificationdelivery"],
)  # fmt: skip
def test_changelists_render_read_only(
    world_a: TenantWorld, staff_client: Client, name: str
) -> None:
    channel_for_world(world_a)
    cause_rule_for_world(world_a)
    breach(world_a)
    assert staff_client.get(f"/admin/incidents/{name}/").status_code == 200
    assert staff_client.get(f"/admin/incidents/{name}/add/").status_code == 403


def test_channel_secrets_never_show(world_a: TenantWorld, staff_client: Client) -> None:
    channel = channel_for_world(world_a)
    page = staff_client.get(f"/admin/incidents/notificationchannel/{channel.pk}/change/")
    assert page.status_code == 200
    assert NotificationChannel.objects.get(pk=channel.pk).secret not in page.content.decode()
