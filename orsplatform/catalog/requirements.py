"""What a package asks to have installed: ``requirements.txt``, ``pyproject.toml``'s
``[project].dependencies`` and manifest.toml's ``requirements``, read as data (no tenant code runs).

Only plain PEP 508 requirements from the package index are accepted. Options (``-e``, ``-r``,
``--index-url``, ``-f`` …), URLs and local paths are refused: the build may reach the registry and
nothing else, and a requirements file must not pick another index or pull files from outside the
package. A requirement on one of the SDKs the worker boundary speaks must admit the version the
platform pins: an environment cannot swap the SDK out from under the platform.

OpenEnv's SDK (``openenv``) is installed only into the environments that ask for it, and always at
the platform's version (``ORS_OPENENV_VERSION``), the one its sandbox adapter speaks. Before 0.4 its
distribution was called ``openenv-core``, and OpenEnv's own examples still require that name
(``openenv-core[core]>=0.2.2``): it is read as a requirement on the same SDK.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from django.conf import settings
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# The distributions the sandbox worker itself imports, installed into every built environment at
# the platform's own versions (the worker speaks these SDKs and frames with orjson).
PINNED = ("ors-sdk", "openreward", "orjson")
# SDKs pinned when asked for: the names a package may use, and the distribution installed.
ON_REQUEST = {"openenv": "openenv", "openenv-core": "openenv"}
MAX_REQUIREMENTS = 200
MAX_LINE = 500


class RequirementsError(ValueError):
    """The package's requirements cannot be built; the message says which line and why."""


def platform_pins() -> list[str]:
    return [f"{name}=={metadata.version(name)}" for name in PINNED]


def _parse(line: str, where: str) -> Requirement:
    if len(line) > MAX_LINE:
        raise RequirementsError(f"{where}: a requirement longer than {MAX_LINE} characters.")
    if line.startswith("-"):
        raise RequirementsError(f"{where}: {line.split()[0]!r} options are not accepted; list packages "
                                "from the package index only (name and version specifiers).")
    try:
        requirement = Requirement(line)
    except InvalidRequirement as exc:
        raise RequirementsError(f"{where}: {line!r} is not a requirement ({exc}).") from None
    if requirement.url:
        raise RequirementsError(f"{where}: {line!r} names a URL; only packages from the package index "
                                "can be installed.")
    return requirement


def _check_pinned(requirement: Requirement, where: str) -> None:
    name = canonicalize_name(requirement.name)
    if name not in PINNED:
        return
    version = metadata.version(name)
    if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
        raise RequirementsError(
            f"{where}: {requirement} cannot be met: this platform runs environments with {name} {version} "
            f"(the SDK its sandbox speaks). Require {name}=={version}, a range that includes it, or "
            "leave the line out.")


def _on_request(requirement: Requirement, where: str) -> str | None:
    """The pinned requirement for an SDK installed on request, or None for any other package."""
    name = canonicalize_name(requirement.name)
    if name not in ON_REQUEST:
        return None
    version = settings.ORS_OPENENV_VERSION
    # openenv-core's own numbers (0.1-0.3) say nothing about openenv's: only openenv's are checked.
    if name == ON_REQUEST[name] and requirement.specifier and not requirement.specifier.contains(
            version, prereleases=True):
        raise RequirementsError(
            f"{where}: {requirement} cannot be met: this platform runs OpenEnv environments with {name} "
            f"{version} (the SDK its sandbox speaks). Require {name}=={version}, a range that includes it, "
            "or openenv-core.")
    marker = f"; {requirement.marker}" if requirement.marker else ""
    return f"{ON_REQUEST[name]}=={version}{marker}"


def _requirements_txt(path: Path) -> list[tuple[str, str]]:
    lines = []
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line:
            lines.append((line, f"{path.name} line {number}"))
    return lines


def _pyproject(path: Path) -> list[tuple[str, str]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RequirementsError(f"pyproject.toml is not valid TOML: {exc}") from None
    project = data.get("project", {})
    deps = project.get("dependencies", []) if isinstance(project, dict) else []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise RequirementsError("pyproject.toml: [project].dependencies must be a list of strings.")
    return [(d.strip(), "pyproject.toml [project].dependencies") for d in deps if d.strip()]


def collect(root: Path, manifest: dict) -> list[str]:
    """The package's requirements, normalized and sorted (empty: it runs on the platform's own
    runtime). Raises RequirementsError for anything that cannot be built."""
    found: list[tuple[str, str]] = []
    if (root / "requirements.txt").is_file():
        found += _requirements_txt(root / "requirements.txt")
    if (root / "pyproject.toml").is_file():
        found += _pyproject(root / "pyproject.toml")
    found += [(r.strip(), "manifest.toml requirements") for r in manifest.get("requirements", [])]
    if len(found) > MAX_REQUIREMENTS:
        raise RequirementsError(f"The package lists {len(found)} requirements; the limit is {MAX_REQUIREMENTS}.")
    out = set()
    for line, where in found:
        requirement = _parse(line, where)
        _check_pinned(requirement, where)
        out.add(_on_request(requirement, where) or str(requirement))
    return sorted(out)


def notes(root: Path) -> list[str]:
    """What the package carries that the platform reads but does not use."""
    found = []
    if (root / "Dockerfile").is_file():
        found.append("The package has a Dockerfile. It is not built: the platform runs the package in its "
                     "own sandbox, with the requirements installed from requirements.txt / pyproject.toml "
                     "(runtime = \"container\" in manifest.toml runs the image instead: docs/containers.md).")
    return found
