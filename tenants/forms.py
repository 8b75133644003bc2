"""Page forms; they check shape only, services own the rules."""

from __future__ import annotations

from django import forms
from django.conf import settings

from tenants.models import Role, Scope


class SignupForm(forms.Form):
    email = forms.EmailField(max_length=254)
    password = forms.CharField(widget=forms.PasswordInput, strip=False)
    organisation = forms.CharField(max_length=120, label="Organisation name")


class TenantSettingsForm(forms.Form):
    name = forms.CharField(max_length=120)


class InviteForm(forms.Form):
    email = forms.EmailField()
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenForm(forms.Form):
    name = forms.CharField(max_length=80)
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[Scope.READ]
    )
    expires_in_days = forms.IntegerField(
        min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, initial=settings.API_TOKEN_DEFAULT_DAYS
    )


class NewTenantForm(forms.Form):
    name = forms.CharField(max_length=120, label="Organisation name")
