"""A tenant environment that probes the kernel-side walls of the sandbox: file locks, refused
syscalls, memory across forked children, the sized /dev and /dev/shm, inherited descriptors,
host paths, and a stray child that outlives a replaced clean-up (tests/executors/test_sandbox_kernel.py)."""

from __future__ import annotations

import textwrap

KERNEL_ENV = textwrap.dedent(r'''
    import ctypes
    import errno
    import fcntl
    import json
    import os
    import sqlite3
    import struct
    import subprocess
    import sys
    import time

    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    LIBC = ctypes.CDLL(None, use_errno=True)
    # x86-64 syscall numbers
    NR = {"ptrace": 101, "process_vm_readv": 310, "unshare": 272, "mount": 165, "bpf": 321,
          "io_uring_setup": 425, "perf_event_open": 298, "keyctl": 250}
    F_OFD_SETLK, F_OFD_GETLK = 37, 36
    SHARED = os.__file__  # a read-only file every worker sees


    def attempt(fn):
        try:
            return {"ok": True, "value": fn()}
        except BaseException as exc:  # noqa: BLE001 - reporting what failed is the point
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                    "errno": getattr(exc, "errno", None)}


    def syscall(name):
        buf = ctypes.create_string_buffer(256)
        args = {
            "ptrace": (0, 0, 0, 0),  # PTRACE_TRACEME
            "process_vm_readv": None,
            "unshare": (0x10000000,),  # CLONE_NEWUSER
            "mount": (b"none", b"/tmp", b"tmpfs", 0, 0),
            "bpf": (0, ctypes.addressof(buf), 48),  # BPF_MAP_CREATE
            "io_uring_setup": (1, ctypes.addressof(buf)),
            "perf_event_open": (ctypes.addressof(buf), 0, -1, -1, 0),
            "keyctl": (0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
        }[name]
        if name == "process_vm_readv":
            data = ctypes.create_string_buffer(b"x" * 16)
            iov_local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 16)
            iov_remote = (ctypes.c_void_p * 2)(ctypes.addressof(data), 16)
            args = (os.getpid(), ctypes.addressof(iov_local), 1, ctypes.addressof(iov_remote), 1, 0)
        ctypes.set_errno(0)
        got = LIBC.syscall(NR[name], *args)
        return {"result": got, "errno": ctypes.get_errno() if got == -1 else 0}


    def locks():
        out = {}
        with open(SHARED, "rb") as f:
            out["flock"] = attempt(lambda: fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB))
            out["fcntl"] = attempt(lambda: fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 100))
            ofd = struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 100, 1, 0)
            out["ofd"] = attempt(lambda: fcntl.fcntl(f, F_OFD_SETLK, ofd))
            out["ofd_get"] = attempt(lambda: fcntl.fcntl(f, F_OFD_GETLK, ofd))
            # The raw call with high bits set in cmd, which the kernel drops (a 32-bit int).
            lock = ctypes.create_string_buffer(ofd)
            for name, cmd in (("raw_ofd_high", (1 << 32) | F_OFD_SETLK), ("raw_setlk_high", (1 << 32) | 6)):
                ctypes.set_errno(0)
                got = LIBC.syscall(72, ctypes.c_long(f.fileno()), ctypes.c_long(cmd), lock)
                out[name] = ({"ok": True, "value": got} if got != -1 else
                             {"ok": False, "error": "raw fcntl", "errno": ctypes.get_errno()})
        return out


    HELD = []

    def hold_lock():
        """An exclusive lock on the shared file, kept (with its descriptor) after the call."""
        f = open(SHARED, "rb")
        HELD.append(f)
        return fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


    def hog(mib, children):
        pids = []
        for _ in range(children):
            pid = os.fork()
            if pid == 0:
                try:
                    block = b"x" * (mib << 20)  # written, so every page is resident
                    time.sleep(120)
                finally:
                    os._exit(0)
            pids.append(pid)
        return pids


    def fill(path, mib):
        """mib MiB into files of at most 16 MiB (a file's size has its own rlimit)."""
        written = 0
        chunk = b"y" * (1 << 20)
        while written < mib:
            with open(f"{path}.{written}", "wb") as f:
                for _ in range(min(16, mib - written)):
                    f.write(chunk)
                    f.flush()
                    written += 1
        return written


    def sqlite(path):
        start = time.monotonic()
        result = attempt(lambda: sqlite3.connect(path, uri=True).execute("create table t (x)").fetchall())
        result["seconds"] = time.monotonic() - start
        return result


    def replace_clean_up_and_leave_a_child(mark):
        worker = sys.modules["__main__"]
        worker.end_strays = lambda: None  # the worker's own clean-up does nothing now
        return subprocess.Popen(["sleep", mark], start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL).pid


    def read(path):
        with open(path, "rb") as f:
            return f.read().decode("latin-1")


    def writable(roots):
        """Every file under `roots` that opens for writing (opened and closed, nothing written)."""
        opened, tried = [], 0
        for root in roots:
            walked = [(os.path.dirname(root), [], [os.path.basename(root)])] if os.path.isfile(root) else os.walk(root)
            for dirpath, dirnames, filenames in walked:
                if dirpath == "/proc":  # processes' own files are theirs; the kernel's are the rest
                    dirnames[:] = [d for d in dirnames if not d.isdigit() and d not in ("self", "thread-self")]
                for name in filenames:
                    path = os.path.join(dirpath, name)
                    tried += 1
                    try:
                        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY))
                        opened.append(path)
                    except OSError:
                        pass
        return {"opened": opened, "tried": tried}


    def owners():
        """Who this process is, and who owns the files every worker shares."""
        shared = [SHARED, os.path.realpath(sys.executable), "/usr/bin/sh", "/usr/lib/os-release",
                  os.path.dirname(SHARED), "/ors/env/env.py", "/ors/env"]
        return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                "uid_map": read("/proc/self/uid_map"), "status": read("/proc/self/status"),
                "no_new_privs": LIBC.prctl(39, 0, 0, 0, 0),  # PR_GET_NO_NEW_PRIVS
                "owners": {p: os.stat(p).st_uid for p in shared if os.path.exists(p)}}


    PAGE = os.sysconf("SC_PAGE_SIZE")


    def residency(op, pages):
        """The page cache of the shared file SHARED: evict it, touch `pages` of it (no read-ahead),
        or read which pages are resident with mincore (or cachestat's count)."""
        fd = os.open(SHARED, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if op == "evict":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                return {"pages": size // PAGE}
            if op == "touch":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                for page in pages:
                    os.pread(fd, 1, page * PAGE)
                return {"touched": pages}
            if op == "nowait":  # a read that fails with EAGAIN when the page is not cached
                seen = {}
                for page in pages:
                    buf = bytearray(1)
                    try:
                        seen[page] = os.preadv(fd, [buf], page * PAGE, os.RWF_NOWAIT)
                    except OSError as exc:
                        seen[page] = -exc.errno
                return {"pages": seen}
            if op == "cachestat":
                LIBC.syscall.restype = ctypes.c_long
                rng = (ctypes.c_uint64 * 2)(0, 0)
                stat = (ctypes.c_uint64 * 5)()
                ctypes.set_errno(0)
                got = LIBC.syscall(451, fd, ctypes.byref(rng), ctypes.byref(stat), 0)
                return {"result": got, "errno": ctypes.get_errno() if got == -1 else 0, "cached": stat[0]}
            LIBC.mmap.restype = ctypes.c_void_p
            LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            start = LIBC.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: nothing is read yet
            count = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * count)()
            ctypes.set_errno(0)
            got = LIBC.mincore(ctypes.c_void_p(start), size, vec)
            error = ctypes.get_errno() if got == -1 else 0
            LIBC.munmap(ctypes.c_void_p(start), size)
            return {"result": got, "errno": error, "resident": [i for i in range(count) if vec[i] & 1]}
        finally:
            os.close(fd)


    class Ask(BaseModel):
        what: str
        arg: str = ""
        n: int = 0
        m: int = 0


    class Kernel(Environment):
        def __init__(self, task_spec=None, secrets=None):
            super().__init__(task_spec or {}, secrets or {})

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": 0}]

        def get_prompt(self):
            return [TextBlock(text="probe the kernel")]

        @tool
        def probe(self, params: Ask) -> ToolOutput:
            """One probe, chosen by `what`."""
            what, arg = params.what, params.arg
            value = {
                "locks": lambda: locks(),
                "proc_locks": lambda: attempt(lambda: read("/proc/locks")),
                "hold_lock": lambda: attempt(hold_lock),
                "commands": lambda: sorted(filter(None, (attempt(lambda: read(f"/proc/{p}/cmdline")).get("value")
                                                         for p in os.listdir("/proc") if p.isdigit()))),
                "syscall": lambda: syscall(arg),
                "hog": lambda: hog(params.n, params.m),
                "fill": lambda: attempt(lambda: fill(arg, params.n)),
                "fds": lambda: sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
                "read": lambda: attempt(lambda: read(arg)),
                "writable": lambda: writable(arg.split(",")),
                "owners": lambda: owners(),
                "kernel": lambda: {"version": read("/proc/version"), "release": os.uname().release},
                "residency": lambda: attempt(lambda: residency(arg, list(range(params.n, params.m)))),
                "sqlite": lambda: sqlite(arg),
                "stray": lambda: replace_clean_up_and_leave_a_child(arg),
                "threads": lambda: attempt(lambda: subprocess.run([sys.executable, "-c", "import threading, "
                                                                   "sqlite3; t = threading.Thread(target=print); "
                                                                   "t.start(); t.join()"], check=True,
                                                                  capture_output=True).returncode),
            }[what]()
            return ToolOutput(blocks=[TextBlock(text=json.dumps(value))], reward=0.0)
''')

KERNEL_MANIFEST = textwrap.dedent('''
    name = "kernel"
    description = "Probes the sandbox's kernel-side walls (tests only)."
    entrypoint = "env:Kernel"
    visibility = "public"
    tool_timeout_seconds = 30

    [sandbox]
    memory_mb = 1024
    tmp_mb = 64
''')


def write_kernel_env(path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "env.py").write_text(KERNEL_ENV)
    (path / "manifest.toml").write_text(KERNEL_MANIFEST)
