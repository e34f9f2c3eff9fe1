"""The exec wrapper in front of bubblewrap: ``python -I -S launch.py SPEC_JSON``.

Run by the supervisor for every sandboxed process (workers, the inspector, the prompt renderer,
the build sandbox). In this order, before anything of the tenant exists:

1. joins the worker's cgroups (so bubblewrap and everything it forks is counted from the start);
2. dies with its supervisor (PR_SET_PDEATHSIG; bubblewrap's --die-with-parent carries it on);
3. sets the rlimits;
4. hands bubblewrap its options, the syscall filter and generated files through memfds
   (``--args FD``, ``--seccomp FD``, ``--ro-bind-data FD``), so /proc/1/cmdline inside the sandbox
   names no host path, and the files to copy into the sandbox as open descriptors (``--file FD``);
5. closes every other descriptor it inherited (an event loop such as uvloop passes inheritable
   descriptors on even with close_fds=True; a listening socket must never reach tenant code);
6. execs bubblewrap.

Standard library only, and nothing imported that -S leaves out: it starts once per worker.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import sys

PR_SET_PDEATHSIG = 1
SIGKILL = 9


def _die_with_parent(parent: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before the line above took effect
        os._exit(1)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # no MFD_CLOEXEC: bubblewrap reads it after the exec
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close_all_but(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        for procs in spec.get("cgroups", ()):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    except OSError as exc:
        print(f"could not enter the worker's cgroup: {exc}", file=sys.stderr)
        os._exit(126)
    if spec.get("parent"):
        _die_with_parent(spec["parent"])
    keep = {0, 1, 2}
    options: list[str] = []
    if spec.get("seccomp"):
        fd = _memfd("seccomp", base64.b64decode(spec["seccomp"]))
        keep.add(fd)
        options += ["--seccomp", str(fd)]
    for dest, content in spec.get("files", ()):
        fd = _memfd("file", content.encode())
        keep.add(fd)
        options += ["--ro-bind-data", str(fd), dest]
    # Copied into the sandbox's root (which is then remounted read-only): bubblewrap reads them
    # from these descriptors, so no mount names their host paths.
    for source, dest in spec.get("copies", ()):
        try:
            fd = os.open(source, os.O_RDONLY)
        except OSError as exc:
            print(f"could not open a file of the package: {exc.strerror}", file=sys.stderr)
            os._exit(126)
        keep.add(fd)
        options += ["--file", str(fd), dest]
    args = _memfd("args", b"".join(a.encode() + b"\0" for a in [*options, *spec["bwrap"][1:]]))
    keep.add(args)
    for fd in keep - {0, 1, 2}:
        os.set_inheritable(fd, True)
    _close_all_but(keep)
    for name, value in spec.get("rlimits", ()):
        resource.setrlimit(getattr(resource, name), (value, value))
    bwrap = spec["bwrap"][0]
    os.execv(bwrap, [bwrap, "--args", str(args), *spec["argv"]])


if __name__ == "__main__":
    main()
