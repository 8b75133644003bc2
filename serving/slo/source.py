"""YAML reading for contracts: a size limit, duplicate keys as errors, and lines for paths.

The loader keeps YAML 1.1's surprises out: `off`/`no`/`yes` stay strings (a gate `mode: off`
must not turn into False) and dates stay strings, so a document is plain JSON data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from serving.slo.errors import ContractError, FieldError, PathItem, format_path

MAX_BYTES = 64 * 1024
MAX_NODES = 50_000  # expanded through aliases, so an alias bomb stays small
MAX_DEPTH = 64

_BOOL = "tag:yaml.org,2002:bool"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class ContractLoader(yaml.SafeLoader):
    """YAML 1.2 scalars: only true/false are booleans (no yes/no/on/off), and dates stay
    strings, so a contract means what it says."""


ContractLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YAML12_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
ContractLoader.add_implicit_resolver(_BOOL, _YAML12_BOOL, "tTfF")


def _fail(line: int | None, message: str) -> ContractError:
    return ContractError([FieldError(line, "", message)])


def compose(text: str, *, many: bool = False) -> list[tuple[yaml.Node, Any]]:
    """(node, data) for each document; raises ContractError for unusable YAML."""
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        raise _fail(None, f"the document is {size} bytes; the limit is {MAX_BYTES} (64 KiB)")
    try:
        loader = ContractLoader(text)
    except yaml.reader.ReaderError as exc:  # the reader refuses control characters up front
        where = text.count("\n", 0, exc.position) + 1
        raise _fail(where, f"invalid YAML: character #x{exc.character:04x}: {exc.reason}") from exc
    try:
        nodes: list[yaml.Node] = []
        if many:
            while loader.check_node():
                node = loader.get_node()
                if node is not None:
                    nodes.append(node)
        else:
            single = loader.get_single_node()
            if single is not None:
                nodes.append(single)
        for node in nodes:
            _check_tree(node)
        return [(node, loader.construct_document(node)) for node in nodes]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        problem = exc.problem or exc.context or "cannot be read"
        raise _fail(line, f"invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise _fail(None, f"invalid YAML: {exc}") from exc
    except RecursionError as exc:
        raise _fail(None, "invalid YAML: nested too deeply") from exc
    finally:
        loader.dispose()


def _check_tree(root: yaml.Node) -> None:
    errors: list[FieldError] = []
    budget = [MAX_NODES]

    def walk(node: yaml.Node, path: list[PathItem]) -> None:
        budget[0] -= 1
        if budget[0] < 0 or len(path) > MAX_DEPTH:
            raise _fail(node.start_mark.line + 1, "the document is too large or too deeply nested")
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, [*path, index])
        elif isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                if key.tag == _MERGE:
                    continue
                line = key.start_mark.line + 1
                if not isinstance(key, yaml.ScalarNode):
                    errors.append(FieldError(line, format_path(path), "keys must be plain strings"))
                    continue
                if key.value in seen:
                    message = f"duplicate key '{key.value}' (first at line {seen[key.value]})"
                    errors.append(FieldError(line, format_path([*path, key.value]), message))
                else:
                    seen[key.value] = line
                walk(value, [*path, key.value])

    walk(root, [])
    if errors:
        raise ContractError(errors)


def line_of(root: yaml.Node | None, path: Sequence[PathItem]) -> int | None:
    """1-based line of the field at `path`, or of the nearest parent that exists."""
    if root is None:
        return None
    node, line = root, root.start_mark.line + 1
    for item in path:
        if isinstance(node, yaml.MappingNode) and isinstance(item, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == item:
                    node, line = value, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int):
            if not 0 <= item < len(node.value):
                return line
            node = node.value[item]
            line = node.start_mark.line + 1
        else:
            return line
    return line
