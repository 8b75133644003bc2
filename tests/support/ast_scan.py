"""An AST scanner of the product code for the layout and convention tests: every import a file
makes, at any nesting level, relative imports resolved, `importlib.import_module` strings too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("portal", "tenants", "serving", "incidents")


def product_files(*folders: str) -> list[Path]:
    """The Python files of the product (or of `folders`), migrations aside."""
    return sorted(
        p
        for app in folders or PRODUCT
        for p in (ROOT / app).rglob("*.py")
        if "migrations" not in p.relative_to(ROOT).parts
    )


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def absolute_module(path: Path, node: ast.ImportFrom, module: str | None = None) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against the module
    `path` holds: `module`, or the one its place in the repository names)."""
    if node.level == 0:
        return node.module or ""
    package = (module or module_of(path)).split(".")
    if path.name != "__init__.py":
        package.pop()
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path, module: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in the file, at any nesting level: `import x`,
    `from x import y` (as x and x.y), relative imports resolved, and importlib string literals."""
    for node in ast.walk(tree_of(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            source = absolute_module(path, node, module)
            yield node.lineno, source
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
