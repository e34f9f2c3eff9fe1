"""Reading one file of a stored package for the files view: size-capped, text only, and never
through a link.

Stored packages are unpacked without links (catalog/packages.py), but the path comes from a URL and
the folder is on the host, so every component is opened relative to the one before it with
O_NOFOLLOW: a link anywhere on the way (planted later, or a bug elsewhere) is refused, never
followed, and ``..`` or an absolute path never leaves the package.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_VIEW_BYTES = 256 * 1024  # shown of one file; the rest is cut with a note
SNIFF_BYTES = 8192  # a NUL byte in these, or text that is not UTF-8, marks a file binary
MAX_PATH_CHARS = 1000


@dataclass(frozen=True)
class FileText:
    path: str
    size: int
    text: str = ""
    truncated: bool = False
    binary: bool = False


def _parts(rel: str) -> list[str] | None:
    if not rel or len(rel) > MAX_PATH_CHARS or "\0" in rel or rel.startswith("/"):
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return parts


def read_text(root: Path, rel: str, *, limit: int = MAX_VIEW_BYTES) -> FileText | None:
    """The text of ``root/rel`` (at most ``limit`` bytes), a FileText marked binary, or None when
    there is no such regular file reachable without a link."""
    parts = _parts(rel)
    if parts is None:
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = nxt
        try:
            # O_NONBLOCK: a FIFO planted in a package must not hang the request (it is then
            # refused as not a regular file). Any failure (a link: ELOOP; a name too long; …) is
            # "no such file": the path came from a URL.
            file_fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            return None
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode):  # a folder, a FIFO, a device: checked before Python's open refuses it
        os.close(file_fd)
        return None
    with os.fdopen(file_fd, "rb") as fh:
        head = fh.read(limit + 1)
    truncated = len(head) > limit
    head = head[:limit]
    if b"\0" in head[:SNIFF_BYTES]:
        return FileText(rel, info.st_size, binary=True)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A cut through a multi-byte character at the cap is still text; anything else is not.
        if not truncated or exc.start < len(head) - 3:
            return FileText(rel, info.st_size, binary=True)
        text = head[:exc.start].decode("utf-8")
    return FileText(rel, info.st_size, text=text, truncated=truncated)
