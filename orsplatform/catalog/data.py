"""Environment data: a data archive uploaded beside a package, stored once by content hash, and the
file listings the environment page shows.

An archive (zip or tar.gz, up to ORS_MAX_DATA_ARCHIVE_BYTES) is unpacked with the package rules
(catalog/packages.py: no links, no escaping paths, bounded size, file count and ratio) into
``ORS_DATA_DIR/<sha256 of the archive>``; the same archive uploaded again (by any team, for any
version) is that folder again. A version's stored package names its data folder in
``<package>.data`` (sandbox/bwrap.data_of), which the sandbox mounts read-only at /orwd_data;
without an archive, the package's own ``data/`` folder is mounted there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from orsplatform.catalog import packages
from orsplatform.sandbox.bwrap import DATA_SUFFIX

LISTED_FILES = 1000  # files shown on the environment page (the rest counted)


class DataError(ValueError):
    """The data archive cannot be used; ``check`` is "size" when it is too large."""

    def __init__(self, message: str, *, check: str = "data") -> None:
        super().__init__(message)
        self.check = check


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def folder(data_hash: str) -> Path:
    return Path(settings.ORS_DATA_DIR) / data_hash


def archive_store(*, path: Path, filename: str) -> str:
    """Unpack and store a data archive once; its content hash."""
    limit = settings.ORS_MAX_DATA_ARCHIVE_BYTES
    size = Path(path).stat().st_size
    if size > limit:
        raise DataError(f"The data archive is {size} bytes; the limit is {limit} (ORS_MAX_DATA_ARCHIVE_BYTES).",
                        check="size")
    if packages.kind_of(filename) not in ("zip", "tar.gz", "tar"):
        raise DataError(f"Unsupported data archive {filename!r}: use .zip, .tar.gz (.tgz) or .tar.")
    data_hash = _sha256(Path(path))
    target = folder(data_hash)
    if target.is_dir():
        return data_hash
    limits = (limit, settings.ORS_MAX_DATA_UNPACKED_BYTES, settings.ORS_MAX_DATA_FILES,
              settings.ORS_MAX_COMPRESSION_RATIO)
    try:
        with packages.unpacked(Path(path), filename=filename, limits=limits) as unpacked:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Beside the final place, then renamed: a half-copied folder is never mounted.
            tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
            try:
                shutil.copytree(unpacked.root, tmp / "data")
                try:
                    (tmp / "data").rename(target)
                except OSError:
                    if not target.is_dir():  # not a concurrent upload of the same archive
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except packages.PackageError as exc:
        raise DataError(f"data archive: {exc}".replace("The package", "it"),
                        check="size" if exc.check == "size" else "data") from None
    return data_hash


def record(package_path: Path | str, data_hash: str | None) -> None:
    """Name the data folder beside a stored package (read by the sandbox pool, on runner nodes too)."""
    marker = Path(str(package_path).rstrip("/") + DATA_SUFFIX)
    if not data_hash:
        marker.unlink(missing_ok=True)
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(str(folder(data_hash)))
    tmp.replace(marker)


@dataclass(frozen=True)
class Listing:
    where: str  # "package", "data archive" or "package data/"
    files: list[tuple[str, int]]  # (relative path, bytes), sorted, at most LISTED_FILES
    total_files: int
    total_bytes: int


def listing(root: Path, where: str) -> Listing:
    files: list[tuple[str, int]] = []
    count = total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                size = os.lstat(full).st_size
            except OSError:
                continue
            count += 1
            total += size
            if len(files) < LISTED_FILES:
                files.append((os.path.relpath(full, root), size))
    return Listing(where, sorted(files), count, total)
