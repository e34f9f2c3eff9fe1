"""Which host user tenant code runs as: never one that owns platform or system files.

Run by root, bubblewrap maps the sandbox's user 0 to the host's root (``0 0 1``): tenant code then
owned every root-owned file it could see, which is enough to write the host's ``/proc/sys``
(``kernel.core_pattern = |program`` runs a program as host root at the next crash anywhere) and to
read other workers' page-cache residency with ``mincore``. So when the supervisor is root:

- launch.py makes a user namespace of the sandbox's own with two lines, ``0 0 1`` (bubblewrap does
  its mounts as that root, so the host's folders it binds need not be searchable by anyone else)
  and ``SANDBOX_UID <host uid> 1``, a host uid from an unused range, unique to this sandbox
  (UID_BASE + the launcher's pid, which bubblewrap keeps for the sandbox's whole life), and hands it
  to bubblewrap (``--userns``);
- bubblewrap keeps just CAP_SETUID, CAP_SETGID and CAP_SETPCAP, and ``setpriv`` (the first thing
  the sandbox runs) switches to SANDBOX_UID with no groups, no capabilities, an empty bounding set.
  bubblewrap's no_new_privs stops a set-uid file from giving any of it back.

Tenant code is then the host's UID_BASE + pid: it owns nothing outside its own /tmp, every kernel
file is read-only to it, ``mincore`` on a shared file is blind (and refused by the filter anyway),
and RLIMIT_NPROC counts this sandbox's processes alone. A supervisor that is not root runs bubblewrap
the usual unprivileged way (the sandbox is the platform's own user; docs/isolation.md).

Standard library only: launch.py shares the constants by value, not by import.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
from collections.abc import Callable

# Host uids and gids UID_BASE..UID_BASE + pid_max (at most 2**22): systemd leaves 0x70000000 to
# 0x7FFDFFFF unused (its container ranges end below it), nothing in /etc/passwd or /etc/subuid
# reaches it on a stock system, and it stays under 2**31 for tools that read a uid as signed.
UID_BASE = 0x70000000
# The user tenant code sees itself as inside (any non-zero id: not the namespace's root).
SANDBOX_UID = 1000
# What bubblewrap keeps for setpriv, which drops them all with the switch.
SWITCH_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
# Every namespace but the user's, which launch.py makes.
SPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")


def dropping() -> bool:
    """Does this supervisor start its sandboxes as an unused host uid (it is root)?"""
    return os.geteuid() == 0


def bwrap_options(*, network: bool, disable_userns: Callable[[], bool]) -> list[str]:
    """bubblewrap's namespace and capability options: a user namespace of launch.py's making when
    root (no --unshare-user then: launch.py caps nested namespaces in it), bubblewrap's own
    otherwise (with --disable-userns where `disable_userns()` says this bubblewrap can); the host's
    network namespace only when `network`."""
    if not dropping():
        return ["--unshare-all", *(["--share-net"] if network else []),
                *(["--unshare-user", "--disable-userns"] if disable_userns() else []), "--cap-drop", "ALL"]
    spaces = [s for s in SPACES if not (network and s == "--unshare-net")]
    return [*spaces, "--cap-drop", "ALL", *(a for cap in SWITCH_CAPS for a in ("--cap-add", cap))]


def switch_argv(argv: list[str]) -> list[str]:
    """argv preceded by the switch to SANDBOX_UID (when root): setpriv, bound in with /usr."""
    if not dropping():
        return argv
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--", *argv]


# The installer's sandbox (uv over the shared environments' folder and its cache, wheels only: no
# package's code) is one fixed uid of the range, so what one build writes the next can use. A
# package's own build code never runs as it: a source build gets a uid of its own like a worker.
INSTALLER_UID = UID_BASE


def launch_spec(owned: list[str] | None = None, *, host_uid: int | None = None) -> dict | None:
    """launch.py's `user` entry: the namespace to make, the host uid (by default UID_BASE + the
    launcher's pid), and the folders (`owned`, the build sandbox's writable ones) to give to that
    uid first; None when not root."""
    if not dropping():
        return None
    return {"base": UID_BASE, "host": host_uid, "inside": SANDBOX_UID, "owned": list(owned or [])}


@functools.lru_cache(maxsize=1024)
def readable(top: str) -> None:
    """Make a folder the sandbox binds (a stored package, its data, a copy being inspected) readable
    by the sandbox's user: folders 0755, files 0644 (0755 if executable), links untouched. A
    package copied from a 0700 folder (a pytest tmp_path, an upload's temporary root) or holding
    0600 files was readable only while tenant code ran as the host's root. Only ever adds read bits;
    once per folder and process (stored packages never change); nothing to do when not root."""
    if not dropping() or not os.path.isdir(top):
        return
    for dirpath, _dirnames, filenames in os.walk(top):
        for path in (dirpath, *(os.path.join(dirpath, f) for f in filenames)):
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            want = mode | (0o555 if stat.S_ISDIR(st.st_mode) or mode & 0o111 else 0o444)
            if want != mode:
                os.chmod(path, want)
