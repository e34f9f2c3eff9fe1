"""gVisor (``runsc``): an application kernel between tenant code and the host's.

With ``ORS_SANDBOX=gvisor`` every sandboxed process (workers, the publish-time inspector, prompt
renders, task-row checks, builds) runs in a gVisor sandbox instead of bubblewrap's namespaces: its
system calls are served by gVisor's kernel (the Sentry, itself confined by a seccomp filter of
gVisor's), so a bug in the host kernel's system calls is not reachable from tenant code.

The plan is the one bwrap.py draws, not a second one: ``oci_spec`` reads bubblewrap's options
(binds, tmpfs sizes and modes, symlinks, /proc, /dev, the environment, the folder to start in) and
writes the same view as an OCI runtime spec, which launch.py hands to ``runsc run`` (stdin and
stdout pass through unchanged: the worker's pipe protocol is the same). Limits apply from outside
as for bubblewrap (the worker's cgroup, joined by launch.py before runsc starts, counts gVisor's
processes and the memory they hold for the tenant) and inside (the spec's rlimits, enforced by
gVisor). Mount sources are never shown inside: gVisor's /proc/self/mountinfo names no host path.

The platform (``ORS_GVISOR_PLATFORM``) is how gVisor catches the tenant's system calls:
``ptrace`` works everywhere (this machine: a VM without nested virtualisation), ``systrap`` (newer
gVisor releases) is faster without a VM, ``kvm`` is fastest where /dev/kvm is real (it hangs on a
VM that fakes it). docs/gvisor.md says how to pick one.

Container environments (the Docker engine's ``runsc`` runtime) take their flags from here too:
one runtime model, one place to configure it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

# Operator settings (environment variable -> default); sandbox/config.py lists them with the rest.
GVISOR_DEFAULTS: dict[str, Any] = {
    "ORS_GVISOR_RUNSC": "runsc",  # gVisor's runsc binary
    "ORS_GVISOR_PLATFORM": "ptrace",  # ptrace | systrap | kvm: how gVisor catches system calls
}
# Where each sandbox's OCI bundle and runsc state live while it runs (removed after; launch.py
# sweeps what a killed launcher left).
STATE_ROOT = os.path.join(tempfile.gettempdir(), "ors-gvisor")


def setting(name: str) -> str:
    """From the environment, as Django's settings read it (this package imports no Django: runner
    nodes and the launcher use it too)."""
    return os.environ.get(name) or GVISOR_DEFAULTS[name]


def runsc_path() -> str:
    name = setting("ORS_GVISOR_RUNSC")
    return shutil.which(name) or name


def runsc_global_flags(platform: str | None = None) -> list[str]:
    """The flags every runsc invocation of the platform's takes (its sandboxes and the Docker
    engine's runtime alike): the system-call platform."""
    return [f"--platform={platform or setting('ORS_GVISOR_PLATFORM')}"]


@functools.cache
def _problem(runsc: str, platform: str) -> str | None:
    binary = shutil.which(runsc)
    if binary is None:
        return f"gVisor ({runsc!r}) is not installed (Debian: apt-get install runsc)."
    if os.geteuid() != 0:
        return "gVisor's runsc needs root to start its sandboxes (the supervisor is not root)."
    bundle = Path(tempfile.mkdtemp(prefix="probe-", dir=_state_root()))
    try:
        spec = oci_spec(["--ro-bind", "/usr", "/usr", "--proc", "/proc"], ["/usr/bin/true"], uid=65534)
        (bundle / "config.json").write_text(json.dumps(spec))
        (bundle / "rootfs").mkdir()
        for name, target in root_links():
            os.symlink(target, bundle / "rootfs" / name)
        done = subprocess.run([binary, "--root", str(bundle / "state"), *runsc_global_flags(platform),
                               "--network=none", "--ignore-cgroups", "run", "--bundle", str(bundle),
                               f"probe-{os.getpid()}"],
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"gVisor could not run here: {exc}"
    finally:
        shutil.rmtree(bundle, ignore_errors=True)
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"status {done.returncode}"]
        return f"gVisor could not start a sandbox here ({platform} platform): {detail[0]}"
    return None


def gvisor_problem() -> str | None:
    """Why gVisor cannot run sandboxes here (None: it can). Starts one sandbox, once per process."""
    return _problem(setting("ORS_GVISOR_RUNSC"), setting("ORS_GVISOR_PLATFORM"))


def _state_root() -> str:
    os.makedirs(STATE_ROOT, mode=0o700, exist_ok=True)
    return STATE_ROOT


def root_links() -> list[tuple[str, str]]:
    """The host's merged-/usr links (/bin -> usr/bin, ...), made in every sandbox's root."""
    return [(top, os.readlink(f"/{top}")) for top in ("bin", "sbin", "lib", "lib64", "lib32", "libx32")
            if os.path.islink(f"/{top}")]



def _read_plan(bwrap_args: list[str]) -> dict:
    """bubblewrap's options (the subset bwrap.py writes) as mounts, links to make in the root,
    the environment, the folder to start in and the hostname."""
    plan: dict = {"mounts": [], "links": [], "env": {}, "cwd": "/", "hostname": "sandbox", "read_only": set()}
    mounts, links = plan["mounts"], plan["links"]
    size: str | None = None
    perms: str | None = None
    i = 0
    args = list(bwrap_args)
    while i < len(args):
        flag = args[i]
        if flag in ("--ro-bind", "--bind", "--ro-bind-try", "--bind-try"):
            src, dst = args[i + 1], args[i + 2]
            if "try" not in flag or os.path.exists(src):
                options = ["rbind", "ro" if flag.startswith("--ro") else "rw"]
                mounts.append({"destination": dst, "type": "bind", "source": src, "options": options})
            i += 3
        elif flag == "--symlink":
            links.append([args[i + 1], args[i + 2]])
            i += 3
        elif flag == "--setenv":
            plan["env"][args[i + 1]] = args[i + 2]
            i += 3
        elif flag == "--tmpfs":
            options = ["nosuid", "nodev", f"mode={perms or '0755'}", *([f"size={size}"] if size else [])]
            mounts.append({"destination": args[i + 1], "type": "tmpfs", "source": "tmpfs", "options": options})
            size = perms = None
            i += 2
        elif flag in ("--size", "--perms"):
            size, perms = (args[i + 1], perms) if flag == "--size" else (size, args[i + 1])
            i += 2
        elif flag == "--proc":
            mounts.append({"destination": args[i + 1], "type": "proc", "source": "proc"})
            i += 2
        elif flag == "--dir":
            links.append(["", args[i + 1]])  # a folder: made in the root
            perms = size = None
            i += 2
        elif flag in ("--remount-ro", "--chdir", "--hostname"):
            key = {"--remount-ro": "read_only", "--chdir": "cwd", "--hostname": "hostname"}[flag]
            if key == "read_only":
                plan["read_only"].add(args[i + 1])
            else:
                plan[key] = args[i + 1]
            i += 2
        elif flag in ("--dev", "--cap-add", "--cap-drop", "--userns", "--uid", "--gid"):
            i += 2  # --dev: gVisor gives every sandbox its own minimal /dev
        else:  # --die-with-parent, --new-session, --clearenv, --unshare-*, --share-net, --disable-userns
            i += 1
    return plan


def oci_spec(bwrap_args: list[str], argv: list[str], *, uid: int, rlimits: list[tuple[str, int]] = (),
             network: bool = False) -> dict:
    """The OCI runtime spec for bubblewrap's options `bwrap_args` and `argv`, run as `uid`. The
    spec's "links" (symlinks to make in the root: OCI has no symlink mount) are launch.py's to
    make; runsc never sees them."""
    plan = _read_plan(bwrap_args)
    for mount in plan["mounts"]:
        if mount["destination"] in plan["read_only"] and mount["type"] == "tmpfs":
            mount["options"].append("ro")
    # /proc/sys and /proc/pressure are gVisor's synthetic ones, which write nothing to the host's
    # kernel, and its /proc/locks lists its own locks only. (/dev/shm stays: sized, as bubblewrap's.)
    mounts = [m for m in plan["mounts"] if m["destination"] not in ("/proc/sys", "/proc/pressure", "/proc/locks")]
    env, cwd, hostname, links = plan["env"], plan["cwd"], plan["hostname"], plan["links"]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": uid},
            "args": argv,
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd,
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "noNewPrivileges": True,
            "rlimits": [{"type": name, "hard": value, "soft": value} for name, value in rlimits],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", *(() if network else ("network",)))]},
        "links": links,
    }


def launch_entry(bwrap_args: list[str], argv: list[str], *, rlimits: list[tuple[str, int]], network: bool,
                 files: list[list[str]], copies: list[list[str]], host_sockets: bool = False,
                 locks: bool = False) -> dict:
    """launch.py's `gvisor` entry: runsc and its flags, and the sandbox's OCI spec. `host_sockets`:
    the sandbox may connect to host Unix sockets bound into it (the build sandbox's registry
    proxy); `network`: the host's network (a manifest the operator allowed it), else loopback only."""
    from orsplatform.sandbox import seccomp

    flags = [*runsc_global_flags(), f"--network={'host' if network else 'none'}", "--ignore-cgroups",
             "--oci-seccomp", *(["--host-uds=open"] if host_sockets else [])]
    spec = oci_spec(bwrap_args, argv, uid=65534, rlimits=rlimits, network=network)
    # The platform's syscall filter inside gVisor's kernel too: the same refusals under either runtime.
    spec["linux"]["seccomp"] = seccomp.oci(locks=locks)
    return {"runsc": runsc_path(), "flags": flags, "state_root": STATE_ROOT, "root_links": root_links(),
            "oci": spec, "files": files, "copies": copies}


def container_of(launcher: int) -> tuple[str, str] | None:
    """The runsc state folder and container id of the sandbox launch.py `launcher` runs."""
    try:
        names = os.listdir(STATE_ROOT)
    except OSError:
        return None
    for name in names:
        if name.startswith(f"{launcher}-"):
            return os.path.join(STATE_ROOT, name, "state"), f"ors-{name}"
    return None


def pids_of(listed: object) -> list[int]:
    """The pids in `runsc ps --format json`'s answer: this runsc lists bare pids, newer ones objects."""
    return [p if isinstance(p, int) else p.get("PID") for p in listed or ()
            if isinstance(p, int) or (isinstance(p, dict) and isinstance(p.get("PID"), int))]


def kill_strays(launcher: int) -> int:
    """SIGKILL every process of the gVisor sandbox `launcher` runs but its init (the worker): what
    ended sessions left. Asked of gVisor from outside, so tenant code cannot opt out. Returns how
    many were killed."""
    found = container_of(launcher)
    if found is None:
        return 0
    state, container = found
    runsc = [runsc_path(), "--root", state]
    try:
        listed = subprocess.run([*runsc, "ps", "--format", "json", container], capture_output=True, timeout=30)
        procs = json.loads(listed.stdout or b"[]") if listed.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0
    killed = 0
    for pid in pids_of(procs):
        if pid != 1:
            done = subprocess.run([*runsc, "kill", "--pid", str(pid), container, "KILL"], capture_output=True,
                                  timeout=30)
            killed += done.returncode == 0
    return killed
