"""Print pip constraints pinning every dependency of pyproject.toml to its lowest allowed
version (the highest ``>=`` bound among the extras that name it), for `make test-minimums`:
a floor that admits a version which cannot run (moto 5.2.1 lacks what the sandbox imports)
is found by installing exactly the floors, not by reading them."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)")


def floors(pyproject: Path) -> dict[str, str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    lowest: dict[str, tuple[tuple[int, ...], str]] = {}
    for requirement in requirements:
        match = _FLOOR.match(requirement)
        if match is None:
            continue
        name, version = match.group(1).lower(), match.group(2)
        order = tuple(int(part) for part in re.findall(r"\d+", version))
        if name not in lowest or order > lowest[name][0]:
            lowest[name] = (order, version)
    return {name: version for name, (_, version) in sorted(lowest.items())}


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")
    print("\n".join(f"{name}=={version}" for name, version in floors(path).items()))
