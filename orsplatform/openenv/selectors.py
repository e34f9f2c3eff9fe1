"""What ``/metadata`` reads: the environment's description, its team and the README its package
brought (read as text from the stored package; tenant code is never imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orsplatform.catalog.models import Environment
from orsplatform.catalog.selectors import EnvHandle

README_NAMES = ("README.md", "README.rst", "README.txt", "README")
MAX_README_BYTES = 256 * 1024


def _readme(package_path: str) -> str | None:
    root = Path(package_path)
    for name in README_NAMES:
        path = root / name
        # A package is stored unpacked and validated, but a README is still the tenant's: never
        # follow a link out of the package, and bound what is read.
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                return f.read(MAX_README_BYTES).decode("utf-8", errors="replace")
    return None


def environment_metadata(*, env: EnvHandle) -> dict[str, Any]:
    """OpenEnv's ``EnvironmentMetadata`` for an environment version the caller may see (the caller
    resolved ``env``, which is where tenancy is checked)."""
    row = Environment.objects.select_related("team").filter(id=env.environment_id).first()
    return {
        "name": env.full_name,
        "description": row.description if row is not None else "",
        "readme_content": _readme(env.package_path),
        "version": str(env.version_number),
        "author": row.team.name if row is not None else env.team_slug,
        "documentation_url": None,
    }
