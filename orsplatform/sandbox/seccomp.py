"""The syscall filter every sandboxed process runs under (bubblewrap's --seccomp).

Built with libseccomp (the `pyseccomp` ctypes binding of Debian's libseccomp2), which knows each
architecture's syscall numbers and refuses the other ABIs (i386, x32) of an x86-64 host outright.
Everything is allowed but the calls below, which fail with an errno instead of killing the caller:
tenant code (and the libraries it imports) probe for features and must see a clean error.

Why each one is refused:
- file locks (flock; fcntl's F_SETLK/F_SETLKW/F_GETLK, their OFD forms and leases): every worker
  shares the read-only OS and Python files, and a lock on one of them is visible to every other
  worker, a channel between tenants. ENOSYS ("not implemented": this system has no file locks),
  which libraries treat as locks being unsupported and fail at once: SQLite reports "disk I/O
  error" (ENOLCK or EPERM would make it retry for its busy timeout), filelock raises
  NotImplementedError (it would retry forever on others). SQLite on a file therefore needs
  ``?nolock=1`` (or ``:memory:``); see docs/sandbox.md.
- inotify: a watch on a shared read-only file reports other workers' opens and reads.
- ptrace, process_vm_readv/writev, kcmp: reading or steering another process.
- unshare, setns, clone/clone3 with a namespace flag: new (user) namespaces are kernel attack
  surface the tenant has no use for. clone3 passes its flags in memory a filter cannot read, so
  it fails with ENOSYS, on which glibc (threads) and CPython (fork) fall back to clone.
- keyctl, add_key, request_key: the kernel keyring is not namespaced.
- mincore, cachestat, and preadv2/pwritev2 with RWF_NOWAIT (EOPNOTSUPP): which pages of a file are in the page cache is shared by every worker that
  maps the same read-only file: one worker touching pages and another reading their residency is a
  channel between callers (red team three). ENOSYS; tenant code does not own the shared files
  either (users.py), which makes mincore blind to others' pages even where a filter is missing.
- io_uring, perf_event_open, bpf, userfaultfd: large kernel attack surface, no use here.
- mount and friends, pivot_root, chroot, and the rest of the administration calls: the sandbox's
  mounts are bubblewrap's business, finished before the filter is installed.

The filter is built once per process (it is the same for every worker) and handed to bubblewrap
through a memfd by launch.py.
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile

log = logging.getLogger("orsplatform.sandbox")

# fcntl commands (include/uapi/asm-generic/fcntl.h, linux/fcntl.h): the 64-bit forms are the
# same numbers on 64-bit kernels, and 12-14 only exist on 32-bit ones but cost nothing to refuse.
F_GETLK, F_SETLK, F_SETLKW = 5, 6, 7
F_GETLK64, F_SETLK64, F_SETLKW64 = 12, 13, 14
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
F_SETLEASE, F_GETLEASE, F_NOTIFY = 1024, 1025, 1026
LOCK_COMMANDS = (F_GETLK, F_SETLK, F_SETLKW, F_GETLK64, F_SETLK64, F_SETLKW64,
                 F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY)

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                   CLONE_NEWNET)

DENIED = (
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # namespaces
    "unshare", "setns",
    # keyrings
    "keyctl", "add_key", "request_key",
    # big attack surface
    "io_uring_setup", "io_uring_enter", "io_uring_register", "perf_event_open", "bpf", "userfaultfd",
    # cross-worker notifications on shared files
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init",
    # mounts and roots
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr",
    # administration (no capability remains for them, refused anyway)
    "acct", "quotactl", "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "syslog", "personality", "uselib", "name_to_handle_at",
    "open_by_handle_at", "lookup_dcookie", "vhangup",
)


# Page-cache residency. cachestat (Linux 6.5) is 451 on every architecture (new calls share one
# table), given by number: Debian 12's libseccomp 2.5.4 does not know its name.
CACHESTAT = 451
RESIDENCY = ("mincore", CACHESTAT)
# preadv2's RWF_NOWAIT fails with EAGAIN when a page is not cached: the same oracle, one page a call.
RWF_NOWAIT = 0x00000008


class SeccompUnavailable(Exception):
    """libseccomp (or its binding) is missing."""


def rules(*, locks: bool) -> list[tuple[str | int, int, tuple[tuple[int, int, int], ...]]]:
    """The filter as data: (syscall, errno, ((argument, mask, value), ...)); a call matching every
    condition of a rule (none: always) fails with that errno. Drawn for bubblewrap's BPF program
    (`program`) and gVisor's OCI filter (`oci`) alike."""
    found: list[tuple[str | int, int, tuple[tuple[int, int, int], ...]]] = []
    found += [(name, errno.EPERM, ()) for name in DENIED]
    found.append(("clone3", errno.ENOSYS, ()))
    found += [(name, errno.ENOSYS, ()) for name in RESIDENCY]
    found += [(name, errno.EOPNOTSUPP, ((5, RWF_NOWAIT, RWF_NOWAIT),)) for name in ("preadv2", "pwritev2")]
    found += [("clone", errno.EPERM, ((0, flag, flag),)) for flag in NAMESPACE_FLAGS]
    if not locks:
        found.append(("flock", errno.ENOSYS, ()))
        found += [("fcntl", errno.ENOSYS, ((1, 0xFFFFFFFF, cmd),)) for cmd in LOCK_COMMANDS]
    return found


def _rules(f, *, locks: bool) -> None:
    import pyseccomp as sc

    for name, err, conditions in rules(locks=locks):
        try:
            f.add_rule(sc.ERRNO(err), name, *(sc.Arg(i, sc.MASKED_EQ, mask, value) for i, mask, value in conditions))
        except (RuntimeError, OSError, ValueError):
            log.debug("seccomp: no syscall %s here", name)


def oci(*, locks: bool = False) -> dict:
    """The filter's unconditional EPERM rules as an OCI runtime spec's `linux.seccomp`, which gVisor
    applies inside its sandbox (runsc --oci-seccomp): ptrace, new namespaces, keyrings, io_uring,
    bpf, mounts and the rest are refused under either runtime. This gVisor answers every refusal
    with EPERM (it ignores `errnoRet`) and applies a rule on arguments to every call of its name
    (clone's namespace flags would refuse all threads), so the rest is left to gVisor's kernel,
    where it is no channel: file locks, page-cache residency and namespaces are the sandbox's own,
    not the host's, and clone3 is not implemented (ENOSYS, on which glibc falls back to clone)."""
    names = sorted(name for name, err, conditions in rules(locks=locks)
                   if isinstance(name, str) and err == errno.EPERM and not conditions)
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}]}


@functools.cache
def program(*, locks: bool = False) -> bytes:
    """The BPF program (bytes) bubblewrap installs; `locks` keeps file locks working (the build
    sandbox, where only uv runs and guards its shared cache with them)."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding found no libseccomp
        raise SeccompUnavailable(
            f"libseccomp is not usable ({exc}); install Debian's libseccomp2 and the pyseccomp package") from exc
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    _rules(f, locks=locks)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        data = out.read()
    if not data or len(data) % 8:
        raise SeccompUnavailable("libseccomp produced no filter")
    return data


def available() -> str | None:
    """Why no filter can be built here (None: it can)."""
    try:
        program()
    except SeccompUnavailable as exc:
        return str(exc)
    return None

