"""Errors of a contract document, each naming the line and the field that is wrong."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PathItem = str | int


@dataclass(frozen=True)
class FieldError:
    line: int | None  # 1-based line of the field, or of its parent when the field is missing
    field: str  # dotted path, e.g. "spec.objectives[1].target"; "" for the whole document
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.field}: {self.message}" if self.field else f"{where}{self.message}"


class ContractError(Exception):
    """A contract (or an OpenSLO import) that cannot be used, with every problem found."""

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors = sort_errors(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def sort_errors(errors: Iterable[FieldError]) -> list[FieldError]:
    unique = dict.fromkeys(errors)  # keeps the first of identical errors, in order
    return sorted(unique, key=lambda e: (e.line is None, e.line or 0, e.field))


def format_path(path: Sequence[PathItem]) -> str:
    """("spec", "objectives", 1, "target") -> "spec.objectives[1].target"."""
    out = ""
    for item in path:
        if isinstance(item, int):
            out += f"[{item}]"
        else:
            out += f".{item}" if out else str(item)
    return out
