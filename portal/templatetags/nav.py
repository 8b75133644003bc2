"""The side navigation's links: `{% nav_link "serving-deployments" "Deployments" %}` marks
itself `aria-current="page"` on its own page and on the pages below it (its `match`, a prefix of
URL names, defaults to the URL name)."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


@register.simple_tag(takes_context=True)
def nav_link(
    context: dict[str, Any], url_name: str, label: str, *args: Any, match: str = ""
) -> SafeString:
    request = context.get("request")
    match_obj = getattr(request, "resolver_match", None)
    here = getattr(match_obj, "url_name", "") or ""
    prefixes = (match or url_name).split()
    current = any(here == p or here.startswith(p + "-") for p in prefixes)
    href = reverse(url_name, args=args)
    if current:
        return format_html('<a href="{}" aria-current="page">{}</a>', href, label)
    return format_html('<a href="{}">{}</a>', href, label)
