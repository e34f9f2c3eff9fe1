"""A sandbox worker's stray processes: what its sessions left running (a ``setsid`` child, a
daemon), killed once no session is left.

Imported by the worker inside its sandbox (bound there by binding.py): standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal


def end_strays() -> None:
    """Kill what sessions left running once none is left: in the sandbox's own pid namespace every
    process but its init (bubblewrap's, pid 1, or under gVisor this worker) and this worker is such a leftover (a `setsid`
    child, a daemon), so none outlives the sessions that could have started it, even while the
    worker itself is kept for the next session. Outside a sandbox (ORS_SANDBOX=none) /proc is the
    host's, and nothing is touched."""
    me = os.getpid()
    try:
        # Under gVisor the worker is its sandbox's init (pid 1); under bubblewrap, bubblewrap's is.
        if me != 1:
            with open("/proc/1/cmdline", "rb") as f:
                if b"bwrap" not in f.read():
                    return
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        if pid not in (1, me):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # its own children: reaped, not left as zombies
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
