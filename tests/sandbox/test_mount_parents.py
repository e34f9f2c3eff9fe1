"""sandbox/mount_parents.py: the parents bubblewrap would make 0700 are made 0755 first, ahead of the
modifiers (--size, --perms) that bind to the operation that follows them."""

import pytest

from orsplatform.sandbox.mount_parents import with_parents


def test_each_missing_parent_is_made_once_before_the_first_mount_under_it():
    args = ["--unshare-all", "--ro-bind", "/host/venv/lib", "/ors/venv/lib", "--symlink", "/x", "/ors/venv/bin/python",
            "--setenv", "HOME", "/tmp"]
    assert with_parents(args) == [
        "--unshare-all",
        "--perms", "0755", "--dir", "/ors", "--perms", "0755", "--dir", "/ors/venv",
        "--ro-bind", "/host/venv/lib", "/ors/venv/lib",
        "--perms", "0755", "--dir", "/ors/venv/bin",
        "--symlink", "/x", "/ors/venv/bin/python",
        "--setenv", "HOME", "/tmp"]


def test_a_tmpfs_keeps_its_size_and_mode_and_the_parents_go_before_them():
    args = ["--size", "4096", "--perms", "0555", "--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys"]
    assert with_parents(args) == ["--perms", "0755", "--dir", "/proc", "--size", "4096", "--perms", "0555",
                                  "--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys"]


def test_a_folder_already_mounted_is_not_made_again():
    args = ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/locks", "--tmpfs", "/tmp", "--bind", "/a", "/tmp/a/b"]
    assert with_parents(args) == ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/locks", "--tmpfs", "/tmp",
                                  "--perms", "0755", "--dir", "/tmp/a", "--bind", "/a", "/tmp/a/b"]


def test_an_option_it_does_not_know_is_refused_rather_than_passed_through():
    with pytest.raises(ValueError, match="--overlay"):
        with_parents(["--overlay", "/a", "/b", "/c"])
