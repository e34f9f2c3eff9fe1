"""How containers are run: gVisor (``runsc``) as the Docker engine's OCI runtime, with its flags in
one place.

The runtime is registered with the engine through its daemon config (``runtimes`` with
``runtimeArgs``), so every container of the platform's engine gets the same flags whatever its
``docker run`` says: ptrace (``ORS_GVISOR_PLATFORM``; kvm where the host has it), no network of any
kind inside the sandbox (the runner speaks to the shim over the container's stdio), and the root
file system wrapped in an overlay held in the sandbox's memory: the image stays read-only, writes
(``/workspace``) land in a layer charged to the container's memory limit and thrown away with it.

No Django here: runner nodes read the same variables from their environment.
"""

from __future__ import annotations

import os
import shutil

RUNTIME_NAME = "ors-runsc"


def runsc_path() -> str | None:
    return os.environ.get("ORS_RUNSC") or shutil.which("runsc") or (
        "/usr/bin/runsc" if os.path.exists("/usr/bin/runsc") else None)


def runsc_global_flags() -> list[str]:
    """The flags every runsc invocation gets (the Python sandbox's gVisor mode shares them)."""
    try:  # the lead's shared module, once on main (issue 37)
        from orsplatform.sandbox.gvisor import runsc_global_flags as shared

        return list(shared())
    except ImportError:
        return [f"--platform={os.environ.get('ORS_GVISOR_PLATFORM') or 'ptrace'}"]


def runtime_args() -> list[str]:
    """What the engine passes runsc for every container: the shared flags, no network, the image's
    root behind an overlay in memory."""
    return [*runsc_global_flags(), "--network=none", "--overlay2=root:memory"]


def daemon_runtimes() -> dict:
    path = runsc_path()
    if path is None:
        return {}
    return {RUNTIME_NAME: {"path": path, "runtimeArgs": runtime_args()}}
