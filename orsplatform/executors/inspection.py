"""Running tenant code outside a session: the publish-time inspector (inspector.py) and the
environment pages' prompt renderer (prompt_render.py), each as a child process of its own.

The child runs in the workers' sandbox (sandbox/inspect.py) when there is one, else with a clean
environment and rlimits; either way in its own session, so that the whole process group, forks
included, is killed when it ends or outlives its time.

Nothing of the host is writable from the child, and the platform opens nothing the child could
have left: it is given its input on stdin and gives its results back on stdout, as records
(`Results`), while everything else it prints goes to its stderr, of which the platform keeps a
bounded tail. What the platform keeps beyond the run (the tasks a class lists) it writes itself,
into a folder of its own the child never sees, up to a cap (ORS_INSPECT_RESULT_BYTES); a child
handing back more, or garbage, is stopped at once. The pipes are read with a deadline: a forked
child that outlives the run and holds them open costs at most DRAIN_SECONDS.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
from django.conf import settings

from orsplatform.sandbox.bwrap import runtime_of
from orsplatform.sandbox.cgroups import WorkerCgroup
from orsplatform.sandbox.config import SandboxConfig
from orsplatform.sandbox.inspect import CHILDREN, child_command

READ_CHUNK = 256 * 1024
OUTPUT_TAIL_BYTES = 8000
# After the child exits its group is killed, which closes the pipes at once; a process that left
# the group (only possible without the sandbox) may hold them open, so reading stops this long after.
DRAIN_SECONDS = 2.0
# One record (a report, one task) on the result pipe; tasks are refused past ORS_MAX_TASK_BYTES
# by the ingest anyway, so this only bounds what the platform buffers for one line.
MAX_RECORD_BYTES = 16 * 1024 * 1024
MAX_SPLITS = 1000


class Refused(Exception):
    """Raised by a sink: the child handed back something the platform will not take; it is killed."""


@dataclass(frozen=True)
class ChildRun:
    exited: bool  # within its time limit (else it and its process group were killed)
    returncode: int
    output: str  # the tail of its stderr (its prints, tracebacks)
    refused: str = ""  # why the platform stopped reading it and killed it, if it did

    def how(self) -> str:
        code = self.returncode
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def wait_exited(pid: int, timeout: float) -> bool:
    """Waits for the process to exit without reaping it, so its process group id stays reserved
    until the group has been killed. True when it exited in time."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            # poll, not select: a busy server's descriptors can be numbered past select's 1024.
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(timeout, 0) * 1000))
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)  # fallback without pidfd: poll for the exit
    return True


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Tail:
    """The last `limit` bytes of a stream; the rest is read and dropped."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self.limit = limit
        self.data = bytearray()

    def __call__(self, chunk: bytes) -> None:
        self.data += chunk[-self.limit:]
        del self.data[:-self.limit]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


class Results:
    """The child's result pipe: one record a line, ``R <json object>`` (its report so far: the last
    one counts) or ``T<n> <json>`` (a task of split n, appended by the platform to
    ``tasks_dir/<n>.jsonl``; the child never sees that folder). More than `max_bytes` in all, a
    record longer than MAX_RECORD_BYTES or anything else on the pipe is Refused."""

    def __init__(self, *, max_bytes: int, tasks_dir: Path | None = None) -> None:
        self.max_bytes = max_bytes
        self.tasks_dir = tasks_dir
        self.total = 0
        self.counts: dict[int, int] = {}
        self._partial = bytearray()
        self._report: bytes | None = None
        self._files: dict[int, IO[bytes]] = {}

    def __call__(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.total > self.max_bytes:
            raise Refused(f"handed back more than {_size(self.max_bytes)} (its report and the tasks its "
                          "class lists); put large task sets in task files (tasks/<split>.jsonl)")
        if b"\n" not in chunk:
            self._partial += chunk
        else:
            lines = (bytes(self._partial) + chunk if self._partial else chunk).split(b"\n")
            self._partial = bytearray(lines.pop())
            for line in lines:
                self._record(line)
        if len(self._partial) > MAX_RECORD_BYTES:
            raise Refused(f"handed back a record longer than {_size(MAX_RECORD_BYTES)}")

    def _record(self, line: bytes) -> None:
        if line.startswith(b"R "):
            self._report = line[2:]
            return
        head, sep, body = line.partition(b" ")
        position = head[1:]
        if not (head.startswith(b"T") and sep and position.isdigit() and len(position) <= 4):
            raise Refused("wrote something on its result channel that is not a result")
        n = int(position)
        if self.tasks_dir is None or n >= MAX_SPLITS:
            raise Refused("handed back tasks where none were asked for")
        out = self._files.get(n)
        if out is None:
            self.tasks_dir.mkdir(exist_ok=True)
            out = self._files[n] = open(self.tasks_dir / f"{n}.jsonl", "xb")  # noqa: SIM115 (closed in close())
        out.write(body + b"\n")
        self.counts[n] = self.counts.get(n, 0) + 1

    def report(self) -> dict | None:
        """The last report the child gave, if it is a JSON object."""
        if self._report is None:
            return None
        try:
            report = orjson.loads(self._report)
        except orjson.JSONDecodeError:
            return None
        return report if isinstance(report, dict) else None

    def close(self) -> None:
        for out in self._files.values():
            out.close()


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


@dataclass(frozen=True)
class Supervised:
    exited: bool  # exited before the deadline
    refused: str  # a sink's reason for stopping it ("" if none did)


def supervise(proc: subprocess.Popen, *, timeout: float, feed: bytes = b"",
              sinks: dict[IO[bytes], Callable[[bytes], Any]]) -> Supervised:
    """Write `feed` to the child's stdin, hand every chunk it writes on a piped stream to that
    stream's sink, and wait for it to exit, all within `timeout`. Its process group is killed
    when it exits (so nothing it forked lives on), when the time is up, or when a sink raises
    Refused. Does not reap it (callers proc.wait()): the group id stays reserved until killed."""
    deadline = time.monotonic() + timeout
    poller = select.poll()
    readers: dict[int, Callable[[bytes], Any]] = {}
    for stream, sink in sinks.items():
        fd = stream.fileno()
        os.set_blocking(fd, False)
        readers[fd] = sink
        poller.register(fd, select.POLLIN)
    pending = memoryview(feed)
    stdin_fd = -1
    if proc.stdin is not None:
        if pending:
            stdin_fd = proc.stdin.fileno()
            os.set_blocking(stdin_fd, False)
            poller.register(stdin_fd, select.POLLOUT)
        else:
            proc.stdin.close()
    try:
        pidfd = os.pidfd_open(proc.pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = -1
    exited, draining, refused, ends = False, False, "", deadline
    try:
        while readers or not exited:
            now = time.monotonic()
            if now >= ends:
                break
            wait = ends - now if pidfd >= 0 or exited else min(ends - now, 0.05)
            for fd, _events in poller.poll(wait * 1000):
                if fd == pidfd:
                    exited = True
                    poller.unregister(pidfd)  # readable from now on: polling it again would spin
                elif fd == stdin_fd:
                    try:
                        pending = pending[os.write(fd, pending[:READ_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except OSError:  # it closed its stdin (or ended): what is left is not wanted
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(fd)
                        proc.stdin.close()
                        stdin_fd = -1
                elif fd in readers:
                    try:
                        chunk = os.read(fd, READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        poller.unregister(fd)
                        del readers[fd]
                        continue
                    readers[fd](chunk)
            if not exited and pidfd < 0:
                exited = _exited(proc.pid)
            if exited and not draining:
                draining = True
                kill_group(proc.pid)  # its forks go with it: the pipes close unless one escaped the group
                ends = time.monotonic() + DRAIN_SECONDS
    except Refused as exc:
        refused = str(exc)
        exited = False
    finally:
        kill_group(proc.pid)
        if pidfd >= 0:
            os.close(pidfd)
        if proc.stdin is not None and not proc.stdin.closed:
            with contextlib.suppress(OSError):
                proc.stdin.close()
    return Supervised(exited=exited, refused=refused)


@contextlib.contextmanager
def _scratch(isolated: bool) -> Iterator[Path | None]:
    """HOME and TMPDIR of a child without the sandbox (inside it, a private tmpfs serves)."""
    if isolated:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="orschild-") as tmp:
        yield Path(tmp)


def _end_cgroup(cgroup: WorkerCgroup, timeout: float = 5.0) -> None:
    """Kill whatever of the child is left (a setsid-ed grandchild escapes its process group, never
    its cgroup) and remove the cgroup once the kernel has let its processes go."""
    deadline = time.monotonic() + timeout
    cgroup.kill()
    while not cgroup.remove() and time.monotonic() < deadline:
        cgroup.kill()  # what is left (remove() drops the hierarchies it could remove)
        time.sleep(0.02)  # polling the kernel's release of the killed processes, with a deadline


def run_child(*, module: str, package_dir: Path, args: list[str], timeout: float, results: Results,
              feed: bytes = b"", runtime: str | None = None) -> ChildRun:
    """Run the child `module` (sandbox/inspect.py: CHILDREN) as `<module> PACKAGE_DIR ARGS...` on a
    tenant's package, with `feed` on its stdin and its result pipe read into `results`. `runtime` is the package's built Python
    environment; by default the one recorded beside a stored package (sandbox/bwrap.runtime_of),
    else the platform's own."""
    runtime = runtime or runtime_of(str(package_dir))
    memory, file_bytes = settings.ORS_INSPECT_MEMORY_BYTES, settings.ORS_INSPECT_FILE_BYTES
    sandbox = SandboxConfig.from_settings(settings, threads=1)
    errors = Tail()
    with _scratch(sandbox.isolated) as scratch:
        cgroup = None
        if scratch is None:  # the workers' sandbox: no settings, database or /proc of ours
            # A cgroup of its own, as a worker has: rlimits bind one process each (and
            # RLIMIT_NPROC not uid 0), so forked children would otherwise add up past the limit.
            cgroup = WorkerCgroup.create(memory_bytes=memory, processes=sandbox.defaults.processes,
                                         cpu_weight=sandbox.cpu_weight,
                                         total_cpu_weight=sandbox.total_cpu_weight, runtime=sandbox.mode)
            cmd = child_command(sandbox, module=module, package_dir=package_dir, args=args,
                                memory_bytes=memory, file_bytes=file_bytes, runtime=runtime, cgroup=cgroup)
            env, cwd = {"PATH": "/usr/bin:/bin"}, "/"
        else:
            cmd = [f"{runtime}/bin/python" if runtime else sys.executable, "-m", CHILDREN[module],
                   str(package_dir), *args]
            env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
                   "PYTHONPATH": str(settings.BASE_DIR), "PYTHONDONTWRITEBYTECODE": "1",
                   "ORS_INSPECT_MEMORY_BYTES": str(memory), "ORS_INSPECT_FILE_BYTES": str(file_bytes)}
            cwd = str(scratch)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True)
        try:
            outcome = supervise(proc, timeout=timeout, feed=feed, sinks={proc.stdout: results, proc.stderr: errors})
        finally:
            kill_group(proc.pid)
            proc.wait()
            if cgroup is not None:
                _end_cgroup(cgroup)
            for stream in (proc.stdout, proc.stderr):
                stream.close()
            results.close()
    return ChildRun(exited=outcome.exited, returncode=proc.returncode, output=errors.text(),
                    refused=outcome.refused)
