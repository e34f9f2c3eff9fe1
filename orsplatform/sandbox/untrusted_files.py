"""The one way the platform reads a file from a place that code it does not trust could have written
(a build sandbox's writable folder, a log a child process fed): never through a symbolic link, never
from a FIFO, socket or device, never more than a stated number of bytes.

A path is opened one component at a time below a `root` the platform trusts (its own folder), each
with O_NOFOLLOW, so a directory swapped for a link on the way is refused as well as the file
itself; the file is opened non-blocking (a FIFO cannot hold the open) and must then be a regular
file. Refusals are OSError subclasses, so callers that already treat "could not read it" as an
answer keep doing so.

No Django here: runner nodes and sandbox helpers use it too.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafeFile(OSError):
    """The path is a link, not a regular file, leaves its root, or is larger than allowed."""


def _open_beneath(root: Path | str, relative: str) -> int:
    parts = [p for p in Path(relative).parts if p not in ("", ".")]
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise UnsafeFile(errno.EPERM, "not a path inside its folder", relative)
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeFile(errno.ELOOP, "a folder on the way is a link or not a folder", relative) from None
                raise
            os.close(fd)
            fd = child
        try:
            return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFile(errno.ELOOP, "a symbolic link", relative) from None
            raise
    finally:
        os.close(fd)


def _regular(fd: int, relative: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(errno.EPERM, "not a regular file (a FIFO, socket, device or folder)", relative)
    return st


def read(root: Path | str, relative: str, *, limit: int) -> bytes:
    """The whole file `root/relative`, refused when it holds more than `limit` bytes (also when it
    grows past them while being read)."""
    fd = _open_beneath(root, relative)
    try:
        if _regular(fd, relative).st_size > limit:
            raise UnsafeFile(errno.EFBIG, f"larger than {limit} bytes", relative)
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UnsafeFile(errno.EFBIG, f"larger than {limit} bytes", relative)
        return b"".join(chunks)
    finally:
        os.close(fd)


def tail(root: Path | str, relative: str, *, limit: int) -> bytes:
    """The last `limit` bytes (at most) of the file `root/relative`: for logs, whose end says why."""
    fd = _open_beneath(root, relative)
    try:
        size = _regular(fd, relative).st_size
        return os.pread(fd, limit, max(size - limit, 0))
    finally:
        os.close(fd)


def read_text(root: Path | str, relative: str, *, limit: int) -> str:
    return read(root, relative, limit=limit).decode("utf-8", "replace")
