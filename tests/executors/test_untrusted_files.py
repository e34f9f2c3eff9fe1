"""The one reader for files from places untrusted code could write (sandbox/untrusted_files.py):
it reads regular files up to a cap, and refuses links (the file's or a folder's on the way), FIFOs
(without blocking), devices, paths leaving their folder and files over the cap."""

from __future__ import annotations

import errno
import os

import pytest

from orsplatform.sandbox import untrusted_files
from orsplatform.sandbox.untrusted_files import UnsafeFile
from tests.catalog.hostile_children import answers_within


def test_a_regular_file_is_read_whole_and_its_tail_on_request(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "build.log").write_bytes(b"first\n" + b"x" * 100 + b"\nlast\n")
    assert untrusted_files.read(tmp_path, "logs/build.log", limit=1000).startswith(b"first\n")
    assert untrusted_files.tail(tmp_path, "logs/build.log", limit=6) == b"\nlast\n"


def test_a_symbolic_link_is_refused_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.json").symlink_to(secret)
    (tmp_path / "out" / "environ").symlink_to("/proc/self/environ")
    for name in ("report.json", "environ"):
        with pytest.raises(UnsafeFile, match="symbolic link"):
            untrusted_files.read(tmp_path, f"out/{name}", limit=1 << 20)
        with pytest.raises(UnsafeFile):
            untrusted_files.tail(tmp_path, f"out/{name}", limit=100)


def test_a_folder_swapped_for_a_link_on_the_way_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "resolved.txt").write_text("from elsewhere")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "work").symlink_to(elsewhere)
    with pytest.raises(UnsafeFile, match="folder on the way"):
        untrusted_files.read(tmp_path / "root", "work/resolved.txt", limit=1000)


def test_a_fifo_is_refused_at_once_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "report.json")  # nobody ever writes to it
    with answers_within(10), pytest.raises(UnsafeFile, match="not a regular file"):
        untrusted_files.read(tmp_path, "report.json", limit=1000)


def test_a_device_is_refused(tmp_path):
    os.mknod(tmp_path / "zero", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero: endless
    with pytest.raises(UnsafeFile, match="not a regular file"):
        untrusted_files.read(tmp_path, "zero", limit=1000)
    with pytest.raises(UnsafeFile, match="not a regular file"):
        untrusted_files.read("/dev", "zero", limit=1000)


def test_a_file_over_the_cap_is_refused(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 5000)
    with pytest.raises(UnsafeFile) as refused:
        untrusted_files.read(tmp_path, "big", limit=4096)
    assert refused.value.errno == errno.EFBIG
    assert untrusted_files.tail(tmp_path, "big", limit=4096) == b"x" * 4096


@pytest.mark.parametrize("path", ["../secret", "/etc/passwd", "a/../../secret", "", "."])
def test_paths_leaving_their_folder_are_refused(tmp_path, path):
    with pytest.raises(UnsafeFile, match="not a path inside"):
        untrusted_files.read(tmp_path / "root", path, limit=1000)


def test_a_missing_file_is_an_ordinary_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        untrusted_files.read(tmp_path, "missing", limit=10)
