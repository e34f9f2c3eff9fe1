"""Running tenant code outside a session: the publish-time inspector (inspector.py) and the
environment pages' prompt renderer (prompt_render.py), each as a child process of its own.

The child runs in the workers' sandbox (sandbox/inspect.py) when there is one, else with a clean
environment and rlimits; either way in its own session, so that the whole process group, forks
included, is killed when it ends or outlives its time; its output goes to files, not pipes (a
forked child that outlives it would hold a pipe open forever). Callers read what the child wrote
into its work directory.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from orsplatform.runners.sandbox.config import SandboxConfig
from orsplatform.runners.sandbox.inspect import child_command
from orsplatform.runners.sandbox.pool import runtime_of


@dataclass(frozen=True)
class ChildRun:
    exited: bool  # within its time limit (else it and its process group were killed)
    returncode: int
    output: str  # the tail of its stderr (else stdout)

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
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)  # fallback without pidfd: poll for the exit
    return True


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, limit: int = 8000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - limit, 0))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_child(*, module: str, package_dir: Path, work: Path, args: list[str], timeout: float,
              runtime: str | None = None) -> ChildRun:
    """Run `orsplatform.runners.<module> PACKAGE_DIR ARGS...` on a tenant's package; an argument
    `{work}/name` names the file `name` in `work`, wherever the child sees that directory.
    `runtime` is the package's built Python environment; by default the one recorded beside a
    stored package (sandbox/pool.runtime_of), else the platform's own."""
    runtime = runtime or runtime_of(str(package_dir))
    scratch = work / "home"
    scratch.mkdir(parents=True, exist_ok=True)
    memory, file_bytes = settings.ORS_INSPECT_MEMORY_BYTES, settings.ORS_INSPECT_FILE_BYTES
    env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
           "PYTHONPATH": str(settings.BASE_DIR), "PYTHONDONTWRITEBYTECODE": "1",
           "ORS_INSPECT_MEMORY_BYTES": str(memory), "ORS_INSPECT_FILE_BYTES": str(file_bytes)}
    sandbox = SandboxConfig.from_django(threads=1)
    if sandbox.isolated:  # the workers' sandbox: no settings, database or /proc of ours
        cmd = child_command(sandbox, module=module, package_dir=package_dir, work=work, args=args,
                            memory_bytes=memory, file_bytes=file_bytes, runtime=runtime)
    else:
        cmd = [f"{runtime}/bin/python" if runtime else sys.executable, "-m", f"orsplatform.runners.{module}", str(package_dir),
               *(a.replace("{work}", str(work)) for a in args)]
    with (work / "stdout.log").open("wb") as out, (work / "stderr.log").open("wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                cwd=str(scratch), start_new_session=True)
    try:
        exited = wait_exited(proc.pid, timeout)
    finally:
        kill_group(proc.pid)
        proc.wait()
    return ChildRun(exited=exited, returncode=proc.returncode,
                    output=tail(work / "stderr.log") or tail(work / "stdout.log"))
