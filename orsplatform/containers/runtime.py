"""How containers are run: gVisor (``runsc``) as the Docker engine's OCI runtime, with its flags in
one place.

The runtime is registered with the engine through its daemon config (``runtimes`` with
``runtimeArgs``), so every container of the platform's engine gets the same flags whatever its
``docker run`` says: the platform of ``ORS_GVISOR_PLATFORM`` (sandbox/gvisor.py, shared with the Python sandbox), no network of any
kind inside the sandbox (the runner speaks to the shim over the container's stdio), and the root
file system wrapped in an overlay held in the sandbox's memory: the image stays read-only, writes
(``/workspace``) land in a layer charged to the container's memory limit and thrown away with it.

No Django here: runner nodes read the same variables from their environment.
"""

from __future__ import annotations

import os
import shutil

from orsplatform.sandbox import gvisor

RUNTIME_NAME = "ors-runsc"


def runsc_path() -> str | None:
    """gVisor's runsc, as the Python sandbox finds it (ORS_GVISOR_RUNSC): one runtime, one setting."""
    path = gvisor.runsc_path()
    return path if shutil.which(path) or os.path.exists(path) else None


def runsc_global_flags() -> list[str]:
    """The flags every runsc invocation gets, the Python sandbox's gVisor mode's (ORS_GVISOR_PLATFORM)."""
    return gvisor.runsc_global_flags()


# One runtime per loopback stack, both registered with the engine, so a setting picks one per
# container without restarting the engine (and the tests hold both to the same isolation checks).
NETWORK_STACKS = {"gvisor": (RUNTIME_NAME, "--network=none"), "host": (f"{RUNTIME_NAME}-hostnet", "--network=host")}


def network_stack() -> str:
    """How a container's loopback (the shim speaking to the author's server; the container has no
    other network either way: Docker gives it an empty network namespace) is served:
    ``gvisor`` (default), gVisor's own network stack in the sandbox, so no network system call
    reaches the host kernel; ``host``, the host kernel's stack inside that empty namespace, through
    the sandbox: less gVisor work per message (docs/containers.md has the figures), more of the
    host kernel within the tenant's reach. ORS_CONTAINER_NETWORK_STACK."""
    stack = os.environ.get("ORS_CONTAINER_NETWORK_STACK", "").strip().lower()
    return stack if stack in NETWORK_STACKS else "gvisor"


def runtime_name() -> str:
    """The engine runtime a container starts under (``docker run --runtime``)."""
    return NETWORK_STACKS[network_stack()][0]


def runtime_args(stack: str = "gvisor") -> list[str]:
    """What the engine passes runsc for every container of a runtime: the shared flags, the
    loopback's stack, the image's root behind an overlay in memory."""
    return [*runsc_global_flags(), NETWORK_STACKS[stack][1], "--overlay2=root:memory"]


def daemon_runtimes() -> dict:
    path = runsc_path()
    if path is None:
        return {}
    return {name: {"path": path, "runtimeArgs": runtime_args(stack)} for stack, (name, _) in NETWORK_STACKS.items()}
