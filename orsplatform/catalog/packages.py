"""Environment packages: unpack an upload (zip, tar.gz, a single ``.py``, or a folder) into a private
temporary directory, refusing anything that could escape it or exhaust the disk.

Nothing here runs tenant code. Archives are hostile input: member names are checked before anything is
written (no ``..``, no absolute paths, no links or devices), the declared sizes and the bytes actually
written are both counted against the limits (a member may lie about its size), and the file's first
bytes must match its extension.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from django.conf import settings

CHUNK = 1024 * 1024
# What one directory costs on disk (a filesystem block) and so in the unpacked-bytes budget: a
# tarball of 100,000 empty directories is tiny but unpacks to hundreds of megabytes.
DIRECTORY_BYTES = 4096
# Linux's NAME_MAX: a longer component is refused before the filesystem fails on it.
MAX_COMPONENT_BYTES = 255
# Members that archivers add on their own; skipped rather than refused.
SKIPPED_NAMES = {"__MACOSX", ".DS_Store", "__pycache__", ".git"}
KINDS = {".zip": "zip", ".tar.gz": "tar.gz", ".tgz": "tar.gz", ".tar": "tar", ".py": "py"}
# A ratio check only makes sense above a floor: tiny, very repetitive files compress extremely well.
RATIO_FLOOR_BYTES = 1024 * 1024


class PackageError(Exception):
    """The upload is not an acceptable package. ``check`` is "package", or "size" (answer 413)."""

    def __init__(self, message: str, *, check: str = "package") -> None:
        super().__init__(message)
        self.check = check


@dataclass(frozen=True)
class Unpacked:
    root: Path
    # A slug suggestion when neither the caller nor the manifest names the environment.
    name_hint: str


def kind_of(filename: str) -> str | None:
    name = filename.lower()
    for suffix, kind in sorted(KINDS.items(), key=lambda item: -len(item[0])):
        if name.endswith(suffix):
            return kind
    return None


def slug_hint(name: str) -> str:
    for suffix in sorted(KINDS, key=len, reverse=True):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return slug[:63].strip("-")


def _limits() -> tuple[int, int, int, int]:
    return (settings.ORS_MAX_PACKAGE_BYTES, settings.ORS_MAX_PACKAGE_UNPACKED_BYTES,
            settings.ORS_MAX_PACKAGE_FILES, settings.ORS_MAX_COMPRESSION_RATIO)


def staging_dir() -> Path:
    """Where uploads are staged and unpacked: one folder, so whatever a killed process left there is
    found and removed by the stale-upload sweep (services.uploads_remove_stale)."""
    directory = Path(settings.ORS_UPLOAD_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _check_path_shape(raw: str, parts: list[str]) -> None:
    """Depth and lengths within what every later step (hashing, copying, the sandbox's bind mounts)
    handles, so an odd name is a 400 naming it, not an OSError deep in the filesystem."""
    max_depth, max_path = settings.ORS_MAX_PACKAGE_PATH_DEPTH, settings.ORS_MAX_PACKAGE_PATH_BYTES
    if len(parts) > max_depth:
        raise PackageError(f"Archive member {raw[:200]!r} is nested {len(parts)} levels deep; "
                           f"the limit is {max_depth}.")
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
            raise PackageError(f"Archive member {raw[:200]!r} has a name component longer than "
                               f"{MAX_COMPONENT_BYTES} bytes.")
    if len("/".join(parts).encode("utf-8", "surrogateescape")) > max_path:
        raise PackageError(f"Archive member {raw[:200]!r} has a path longer than {max_path} bytes.")


def _safe_name(raw: str) -> PurePosixPath | None:
    """The member's relative path, or None for a member to skip. Raises for a dangerous name."""
    name = raw.replace("\\", "/")
    if "\x00" in name:
        raise PackageError(f"Archive member {raw!r} has a NUL byte in its name.")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise PackageError(f"Archive member {raw!r} has an absolute path.")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PackageError(f"Archive member {raw!r} points outside the package ('..').")
    if not parts or any(p in SKIPPED_NAMES for p in parts) or parts[-1].endswith(".pyc"):
        return None
    _check_path_shape(raw, parts)
    return PurePosixPath(*parts)


class _Budget:
    """Counts entries (files and directories, named or implied by a file's path) and the bytes they
    take against the package limits, and keeps the tree's shape: a name is a file or a directory,
    once."""

    def __init__(self, compressed_bytes: int, limits: tuple[int, int, int, int] | None = None) -> None:
        _, self.max_bytes, self.max_files, self.ratio = limits or _limits()
        self.compressed = max(compressed_bytes, 1)
        self.files = 0
        self.bytes = 0
        self.data_bytes = 0
        self.file_names: set[PurePosixPath] = set()
        self.dir_names: set[PurePosixPath] = set()

    def _count(self) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise PackageError(f"The package holds more than {self.max_files} files and directories.")

    def add_dir(self, rel: PurePosixPath, raw: str) -> bool:
        """Records ``rel`` and its parents as directories; False when it already was one."""
        if rel in self.dir_names:
            return False
        for path in (*reversed(rel.parents[:-1]), rel):
            if path in self.file_names:
                raise PackageError(f"Archive member {raw!r} puts a directory where the file "
                                   f"{str(path)!r} is.")
            if path not in self.dir_names:
                self.dir_names.add(path)
                self._count()
                self.add_bytes(DIRECTORY_BYTES, compressed=False)
        return True

    def add_file(self, rel: PurePosixPath, raw: str) -> None:
        if rel in self.file_names:
            raise PackageError(f"Archive member {raw!r} appears twice.")
        if rel in self.dir_names:
            raise PackageError(f"Archive member {raw!r} is a file where a directory of the same name is.")
        if rel.parent != PurePosixPath("."):
            self.add_dir(rel.parent, raw)
        self.file_names.add(rel)
        self._count()

    def add_bytes(self, n: int, *, compressed: bool = True) -> None:
        """``compressed``: bytes that came out of the archive's compressed data (what the ratio check
        is about; a directory's block did not)."""
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise PackageError(f"The package unpacks to more than {self.max_bytes} bytes.", check="size")
        if not compressed:
            return
        self.data_bytes += n
        if self.data_bytes > RATIO_FLOOR_BYTES and self.data_bytes > self.ratio * self.compressed:
            raise PackageError(f"The archive expands more than {self.ratio}x (a zip bomb?); refused.")


def _target(root: Path, rel: PurePosixPath) -> Path:
    target = root.joinpath(*rel.parts)
    # Belt and braces: the name check already excludes this, but the resolved path is what counts.
    if not target.resolve().is_relative_to(root.resolve()):
        raise PackageError(f"Archive member {str(rel)!r} points outside the package.")
    if target.exists():
        raise PackageError(f"Archive member {str(rel)!r} appears twice.")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _make_dir(root: Path, rel: PurePosixPath, raw: str, budget: _Budget) -> None:
    if budget.add_dir(rel, raw):
        root.joinpath(*rel.parts).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def _member(raw: str) -> Iterator[None]:
    """What the filesystem still refuses (the budget's shape and name checks come first) is the
    member's fault: a 400 naming it, never an error escaping as a 500."""
    try:
        yield
    except PackageError:
        raise
    except OSError as exc:
        raise PackageError(f"Archive member {raw[:200]!r} cannot be unpacked: "
                           f"{exc.strerror or type(exc).__name__}.") from exc


def _copy_stream(src: BinaryIO, target: Path, budget: _Budget, declared: int | None) -> None:
    written = 0
    with target.open("xb") as out:
        while chunk := src.read(CHUNK):
            written += len(chunk)
            if declared is not None and written > declared:
                raise PackageError(f"Archive member {target.name!r} is larger than its header says.")
            budget.add_bytes(len(chunk))
            out.write(chunk)


def _check_magic(path: Path, kind: str) -> None:
    with path.open("rb") as fh:
        head = fh.read(512)
    ok = {
        "zip": head[:4] in (b"PK\x03\x04", b"PK\x05\x06"),
        "tar.gz": head[:2] == b"\x1f\x8b",
        "tar": head[257:262] == b"ustar",
        "py": b"\x00" not in head,
    }[kind]
    if not ok:
        raise PackageError(f"The file is not a {kind} file, whatever its name says.")


# What zipfile raises for a broken or unsupported archive besides BadZipFile: a lying header
# (EOFError, ValueError), a compression method it lacks (NotImplementedError), a bad deflate stream.
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
              RuntimeError, zlib.error)


def _extract_zip(path: Path, root: Path, budget: _Budget) -> None:
    try:
        archive = zipfile.ZipFile(path)
    except ZIP_ERRORS as exc:
        raise PackageError(f"Not a readable zip file: {exc}") from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > budget.max_files:
            raise PackageError(f"The package holds more than {budget.max_files} files and directories.")
        if sum(i.file_size for i in infos) > budget.max_bytes:
            raise PackageError(f"The package unpacks to more than {budget.max_bytes} bytes.", check="size")
        for info in infos:
            rel = _safe_name(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise PackageError(f"Archive member {info.filename!r} is a symbolic link; links are refused.")
            # Many zippers store permission bits only (no file type): those are plain files.
            if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise PackageError(f"Archive member {info.filename!r} is not a regular file.")
            if rel is None:
                continue
            if info.is_dir():
                with _member(info.filename):
                    _make_dir(root, rel, info.filename, budget)
                continue
            if info.flag_bits & 0x1:
                raise PackageError(f"Archive member {info.filename!r} is encrypted.")
            if info.file_size > RATIO_FLOOR_BYTES and info.file_size > budget.ratio * max(info.compress_size, 1):
                raise PackageError(f"Archive member {info.filename!r} expands more than {budget.ratio}x "
                                   "(a zip bomb?); refused.")
            budget.add_file(rel, info.filename)
            with _member(info.filename):
                target = _target(root, rel)
            try:
                with archive.open(info) as src:
                    _copy_stream(src, target, budget, info.file_size)
            except PackageError:
                raise
            except ZIP_ERRORS as exc:
                raise PackageError(f"Archive member {info.filename!r} is corrupt: {exc}") from exc


def _extract_tar(path: Path, root: Path, budget: _Budget) -> None:
    # Stream mode: members are read in order, each checked before its bytes are written.
    try:
        with tarfile.open(path, mode="r|*") as archive:
            declared = 0
            for member in archive:
                rel = _safe_name(member.name)
                if member.issym() or member.islnk():
                    raise PackageError(f"Archive member {member.name!r} is a link; links are refused.")
                if not (member.isfile() or member.isdir()):
                    raise PackageError(f"Archive member {member.name!r} is not a regular file.")
                if rel is None:
                    continue
                if member.isdir():
                    with _member(member.name):
                        _make_dir(root, rel, member.name, budget)
                    continue
                budget.add_file(rel, member.name)
                declared += member.size
                if declared > budget.max_bytes:
                    raise PackageError(f"The package unpacks to more than {budget.max_bytes} bytes.",
                                       check="size")
                src = archive.extractfile(member)
                if src is None:
                    raise PackageError(f"Archive member {member.name!r} cannot be read.")
                with _member(member.name):
                    target = _target(root, rel)
                _copy_stream(src, target, budget, member.size)
    except PackageError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError, zlib.error) as exc:
        raise PackageError(f"Not a readable tar archive: {exc}") from exc


def _copy_folder(source: Path, root: Path, budget: _Budget) -> None:
    for path in sorted(source.rglob("*")):
        rel = _safe_name(str(path.relative_to(source)))
        if rel is None:
            continue
        if path.is_symlink():
            raise PackageError(f"{path.relative_to(source)} is a symbolic link; links are refused.")
        if path.is_dir():
            _make_dir(root, rel, str(rel), budget)
        elif path.is_file():
            budget.add_file(rel, str(rel))
            with path.open("rb") as src:
                _copy_stream(src, _target(root, rel), budget, None)
        else:
            raise PackageError(f"{path.relative_to(source)} is not a regular file.")


def _unwrap(root: Path) -> tuple[Path, str | None]:
    """`zip -r env.zip env/` puts everything under one folder: publish that folder's content. A
    Python package alone (`mypkg/__init__.py` and no manifest or pyproject in it) stays a package,
    so its modules' absolute imports (`from mypkg.utils import x`) keep working."""
    entries = list(root.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        inner = entries[0]
        if (inner / "__init__.py").exists() and not any(
                (inner / name).exists() for name in ("manifest.toml", "pyproject.toml", "server.py")):
            return root, inner.name
        return inner, inner.name
    return root, None


@contextlib.contextmanager
def unpacked(path: Path, *, filename: str | None = None,
             limits: tuple[int, int, int, int] | None = None) -> Iterator[Unpacked]:
    """Unpack ``path`` (named ``filename`` by its uploader) into a temporary directory removed on exit.
    ``limits``: (compressed bytes, unpacked bytes, files, compression ratio), the package's by default."""
    path = Path(path)
    filename = filename or path.name
    limits = limits or _limits()
    max_compressed = limits[0]
    with tempfile.TemporaryDirectory(prefix="orspkg-", dir=staging_dir()) as tmp:
        root = Path(tmp) / "pkg"
        root.mkdir()
        if path.is_dir():
            budget = _Budget(compressed_bytes=1 << 62, limits=limits)  # a folder is not compressed: no ratio check
            _copy_folder(path, root, budget)
            yield Unpacked(root=root, name_hint=slug_hint(path.resolve().name))
            return
        kind = kind_of(filename)
        if kind is None:
            raise PackageError(f"Unsupported package file {filename!r}: use .zip, .tar.gz (.tgz) or .py.")
        size = path.stat().st_size
        if size > max_compressed:
            raise PackageError(f"The package is {size} bytes; the limit is {max_compressed}.", check="size")
        _check_magic(path, kind)
        budget = _Budget(compressed_bytes=size, limits=limits)
        if kind == "py":
            source = path.read_bytes()
            try:
                source.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PackageError("The file is not Python source (not UTF-8 text), whatever its name says.") from exc
            (root / "env.py").write_bytes(source)
            yield Unpacked(root=root, name_hint=slug_hint(filename))
            return
        if kind == "zip":
            _extract_zip(path, root, budget)
        else:
            _extract_tar(path, root, budget)
        inner, folder = _unwrap(root)
        yield Unpacked(root=inner, name_hint=slug_hint(folder or filename))


def save_upload(upload, *, directory: Path | None = None) -> Path:
    """Write an uploaded file (Django UploadedFile) to disk in chunks; returns its path."""
    directory = directory or staging_dir()
    directory.mkdir(parents=True, exist_ok=True)
    suffix = "".join(PurePosixPath(upload.name or "upload").suffixes[-2:])[:20]
    fd, name = tempfile.mkstemp(dir=directory, suffix=re.sub(r"[^A-Za-z0-9.]", "", suffix))
    with open(fd, "wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    return Path(name)


def remove_quietly(path: Path | str | None) -> None:
    if not path:
        return
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
