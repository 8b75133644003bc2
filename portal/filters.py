"""The lists' day filters (incidents, breaches, the audit log): From / To a day, UTC, both
included; To before From is an error on To."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet


class DayRangeForm(forms.Form):
    since = forms.DateField(required=False, label="From", widget=forms.DateInput({"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput({"type": "date"}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("since", "until"):  # after the list's own filters
            self.fields[name] = self.fields.pop(name)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            self.add_error("until", "must be on or after From.")
        return data


def by_days(rows: QuerySet[Any], field: str, data: dict[str, Any]) -> QuerySet[Any]:
    """`rows` whose `field` (a datetime) falls on the form's days."""
    if data.get("since"):
        rows = rows.filter(**{f"{field}__date__gte": data["since"]})
    if data.get("until"):
        rows = rows.filter(**{f"{field}__date__lte": data["until"]})
    return rows
