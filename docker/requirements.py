"""Print the project's requirements from pyproject.toml, one a line, for the image build.

The Dockerfile installs these before it copies the source, so a code change does not reinstall
torch and Ray. Usage: python requirements.py pyproject.toml [extra,extra...]. The build
backend's own requirements come first, so the project installs after them without fetching.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    found = [*data["build-system"]["requires"], *project["dependencies"]]
    for extra in extras:
        found += optional[extra]
    return list(dict.fromkeys(found))


def main(argv: list[str]) -> None:
    extras = [e.strip() for e in (argv[2] if len(argv) > 2 else "").split(",") if e.strip()]
    print("\n".join(requirements(Path(argv[1]), extras)))


if __name__ == "__main__":
    main(sys.argv)
