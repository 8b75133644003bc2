"""Pure checks the registry services share: `full_clean` as a ValidationFailed, a version
label, an expected SHA-256, a label still free on its model, and a step's elapsed seconds.

They write nothing; the services (serving.registry.services) call them before they do.
"""

from __future__ import annotations

import re
import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from portal.exceptions import ConflictError, ValidationFailed
from serving.registry.models import LABEL_RE, SHA256_RE, Model, ModelVersion


def full_clean(obj: models.Model) -> None:
    """full_clean() as a ValidationFailed naming the first bad field (uniqueness is checked
    by the callers, who answer 409)."""
    try:
        obj.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise ValidationFailed(
            " ".join(messages), field=None if field == "__all__" else field
        ) from None


def clean_sha256(value: str | None) -> str:
    sha = (value or "").strip().lower()
    if sha and not re.fullmatch(SHA256_RE, sha):
        raise ValidationFailed("Give the SHA-256 as 64 hex digits.", field="sha256")
    return sha


def clean_label(label: str) -> str:
    label = (label or "").strip()
    if not label:
        raise ValidationFailed("A version label is required.", field="label")
    if len(label) > 64 or not re.fullmatch(LABEL_RE, label):
        raise ValidationFailed(
            "Use up to 64 letters, digits, '.', '_', '+' and '-', starting alphanumeric.",
            field="label",
        )
    return label


def clean_engines(value: Any) -> list[str]:
    """The engines a version is to be validated for: a list (or comma-separated string) of
    distinct names from serving.engine.choice.ENGINES; none given is the built-in engine."""
    from serving.engine.choice import BUILTIN, ENGINES

    if value in (None, "", []):
        return [BUILTIN]
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValidationFailed("Give a list of engine names.", field="engines")
    out: list[str] = []
    for name in (n.strip() for n in names):
        if name not in ENGINES:
            raise ValidationFailed(
                f"{name!r} is not an engine (engines: {', '.join(ENGINES)}).", field="engines"
            )
        if name not in out:
            out.append(name)
    return sorted(out, key=ENGINES.index)


def check_label_free(model: Model, label: str) -> None:
    if ModelVersion.objects.filter(tenant_id=model.tenant_id, model=model, label=label).exists():
        raise ConflictError(f"{model.name} already has a version {label!r}.", field="label")


def since(started: float) -> float:
    return round(time.perf_counter() - started, 4)
