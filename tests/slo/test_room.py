"""serving/slo is pure Python: no Django, and of the other apps only the dataplane's SLI module."""

from __future__ import annotations

import ast
from pathlib import Path

import serving.slo

ROOM = Path(serving.slo.__file__).parent
ALLOWED = ("serving.slo", "serving.dataplane.sli")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_slo_imports_no_django_and_no_other_app() -> None:
    offending = [
        f"{path.name}: {name}"
        for path in sorted(ROOM.glob("*.py"))
        for name in imported_modules(path)
        if name.split(".")[0] in ("django", "rest_framework", "portal", "tenants", "incidents")
        or (name.startswith("serving") and not name.startswith(ALLOWED))
    ]
    assert len(list(ROOM.glob("*.py"))) >= 7
    assert offending == []
