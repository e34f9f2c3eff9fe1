"""File-level differences between two stored versions of a package.

Versions are content-addressed and immutable (catalog.services._store_package), so a package's file
list is cached under its content hash for good; only the files that differ are read again to diff.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from django.core.cache import cache

from orsplatform.catalog.models import EnvironmentVersion

MAX_DIFF_BYTES = 256 * 1024  # larger files (task data, weights) are compared by hash only
MAX_DIFF_LINES = 2000
MAX_FILES = 2000


@dataclass(frozen=True)
class FileChange:
    path: str
    change: str  # added | removed | changed | same
    size_a: int | None
    size_b: int | None
    lines: list[tuple[str, str]] = field(default_factory=list)  # (kind: add|del|ctx|hunk, text)
    note: str = ""


def package_files(version: EnvironmentVersion) -> dict[str, tuple[int, str]]:
    """{relative path: (size, sha256)} of a stored package; empty when the package is gone."""
    key = f"hub:files:{version.content_hash}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    root = Path(version.package_path)
    files: dict[str, tuple[int, str]] = {}
    if root.is_dir():
        for path in sorted(root.rglob("*")):
            if len(files) >= MAX_FILES:
                break
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as fh:
                    files[str(path.relative_to(root))] = (path.stat().st_size, hashlib.file_digest(fh, "sha256").hexdigest())
    cache.set(key, files, None)
    return files


def _text(version: EnvironmentVersion, rel: str) -> list[str] | None:
    path = Path(version.package_path) / rel
    try:
        if path.stat().st_size > MAX_DIFF_BYTES:
            return None
        return path.read_bytes().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None


def _unified(a: list[str], b: list[str], rel: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in difflib.unified_diff(a, b, fromfile=f"a/{rel}", tofile=f"b/{rel}", lineterm="", n=3):
        if line.startswith(("---", "+++")):
            continue
        kind = "hunk" if line.startswith("@@") else "add" if line.startswith("+") else (
            "del" if line.startswith("-") else "ctx")
        out.append((kind, line))
        if len(out) >= MAX_DIFF_LINES:
            out.append(("hunk", f"… diff cut at {MAX_DIFF_LINES} lines"))
            break
    return out


def version_diff(a: EnvironmentVersion, b: EnvironmentVersion) -> list[FileChange]:
    """Every file of either version, changed ones first, each changed text file with a unified diff."""
    files_a, files_b = package_files(a), package_files(b)
    changes: list[FileChange] = []
    for rel in sorted(set(files_a) | set(files_b)):
        in_a, in_b = files_a.get(rel), files_b.get(rel)
        size_a, size_b = (in_a[0] if in_a else None), (in_b[0] if in_b else None)
        if in_a and in_b and in_a[1] == in_b[1]:
            changes.append(FileChange(rel, "same", size_a, size_b))
            continue
        change = "added" if not in_a else "removed" if not in_b else "changed"
        old = _text(a, rel) if in_a else []
        new = _text(b, rel) if in_b else []
        if old is None or new is None:
            changes.append(FileChange(rel, change, size_a, size_b, note="binary or larger than "
                                                                         f"{MAX_DIFF_BYTES // 1024} KiB: compared by hash"))
        else:
            changes.append(FileChange(rel, change, size_a, size_b, lines=_unified(old, new, rel)))
    order = {"changed": 0, "added": 1, "removed": 2, "same": 3}
    return sorted(changes, key=lambda c: (order[c.change], c.path))
