"""Pages of notification channels: the tenant's channels with a form to add one (each kind's
fields; errors next to the field they are about), a channel's edit form and its removal. A
webhook's signing secret is shown once, on the page that created it; a PagerDuty routing key
and a Slack webhook URL are never shown back in full. Writers send a channel a test message
(`sendtest`): a worker sends it, the row says "sending…" until its outcome shows there."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from incidents import selectors, services
from incidents.models import Severity
from incidents.notifications.models import ChannelKind, NotificationChannel
from incidents.notifications.selectors import channel_last_tests, channel_tests_sending
from incidents.notifications.sendtest import notification_channel_test
from portal.exceptions import PortalError
from tenants.models import Scope, Tenant
from tenants.pages import can_write, form_error, page_actor, tenant_page
from tenants.scoping import get_for_tenant


class ChannelForm(forms.Form):
    kind = forms.ChoiceField(choices=ChannelKind.choices)
    name = forms.CharField(max_length=80)
    url = forms.CharField(
        max_length=500,
        required=False,
        label="URL",
        help_text="webhook: http(s) receiver; Slack: the incoming-webhook URL; PagerDuty: "
        "blank for https://events.pagerduty.com/v2/enqueue",
    )
    email = forms.EmailField(required=False, label="E-mail")
    routing_key = forms.CharField(
        max_length=80,
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="PagerDuty: the Events API v2 integration key",
    )
    min_severity = forms.ChoiceField(choices=Severity.choices, initial=Severity.TICKET)
    is_active = forms.BooleanField(required=False, initial=True, label="Active")


class ChannelEditForm(ChannelForm):
    """The kind stays; a blank URL (Slack) or routing key (PagerDuty) keeps the stored one."""

    def __init__(self, *args: Any, channel: NotificationChannel, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["kind"]
        if channel.kind == ChannelKind.SLACK:
            self.fields["url"].help_text = f"now {channel.url_shown}; blank keeps it"
        if channel.kind == ChannelKind.PAGERDUTY:
            self.fields["routing_key"].help_text = f"now {channel.routing_key_hint}; blank keeps it"


def _edit_initial(channel: NotificationChannel) -> dict[str, Any]:
    return {
        "name": channel.name,
        "url": "" if channel.kind == ChannelKind.SLACK else channel.url,
        "email": channel.email,
        "min_severity": channel.min_severity,
        "is_active": channel.is_active,
    }


def _changes(channel: NotificationChannel, data: dict[str, Any]) -> dict[str, Any]:
    """The form's fields that apply to the channel's kind; blank secrets keep the old ones."""
    changes = {k: data[k] for k in ("name", "min_severity", "is_active")}
    if channel.kind == ChannelKind.EMAIL:
        changes["email"] = data["email"]
    elif channel.kind != ChannelKind.SLACK or data["url"]:
        changes["url"] = data["url"]
    if channel.kind == ChannelKind.PAGERDUTY and data["routing_key"]:
        changes["routing_key"] = data["routing_key"]
    return changes


@require_http_methods(["GET", "POST"])
@tenant_page()
def channels_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    form = ChannelForm(request.POST or None)
    created = None
    if request.method == "POST":
        if not can_write(request):
            messages.error(request, "Your role cannot add notification channels.")
            return redirect("notification-channels", slug=tenant.slug)
        if form.is_valid():
            try:
                channel, secret = services.notification_channel_create(
                    tenant=tenant, actor=page_actor(request), **form.cleaned_data
                )
            except PortalError as exc:
                form_error(form, exc)
            else:
                created = {"channel": channel, "secret": secret}
                form = ChannelForm()
    channels = list(selectors.notification_channel_list(tenant=tenant))
    last_tests = channel_last_tests(tenant=tenant)
    sending = channel_tests_sending(tenant=tenant, channel_ids=[c.pk for c in channels])
    context = {
        "form": form,
        "created": created,
        "rows": [(c, last_tests.get(c.pk), c.pk in sending) for c in channels],
        "can_write": can_write(request),
    }
    return render(request, "incidents/notifications/channels.html", context)


@require_http_methods(["GET", "POST"])
@tenant_page(Scope.WRITE)
def channel_edit(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    channel = get_for_tenant(
        selectors.notification_channel_list(tenant=tenant), tenant=tenant, pk=pk
    )
    form = ChannelEditForm(request.POST or None, channel=channel, initial=_edit_initial(channel))
    if request.method == "POST" and form.is_valid():
        try:
            services.notification_channel_update(
                tenant=tenant,
                actor=page_actor(request),
                channel=channel,
                changes=_changes(channel, form.cleaned_data),
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            messages.success(request, f"Channel {channel.name} saved.")
            return redirect("notification-channels", slug=tenant.slug)
    context = {"form": form, "channel": channel}
    return render(request, "incidents/notifications/channel_edit.html", context)


@require_POST
@tenant_page(Scope.WRITE)
def channel_delete(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    channel = get_for_tenant(
        selectors.notification_channel_list(tenant=tenant), tenant=tenant, pk=pk
    )
    services.notification_channel_delete(tenant=tenant, actor=page_actor(request), channel=channel)
    messages.success(request, f"Channel {channel.name} removed.")
    return redirect("notification-channels", slug=tenant.slug)


@require_POST
@tenant_page(Scope.WRITE)
def channel_test(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """Queue a test message of the channel (a worker sends it) and answer at once: the row
    says "sending…" until the outcome replaces it."""
    channel = get_for_tenant(
        selectors.notification_channel_list(tenant=tenant), tenant=tenant, pk=pk
    )
    try:
        queued = notification_channel_test(
            tenant=tenant, actor=page_actor(request), channel=channel
        )
    except PortalError as exc:
        messages.error(request, f"Test of {channel.name} not sent: {exc.message}")
    else:
        messages.info(request, queued.summary)
    return redirect("notification-channels", slug=tenant.slug)
