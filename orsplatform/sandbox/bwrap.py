"""The command line that starts a sandboxed process: the launcher (launch.py: cgroup, rlimits, the
syscall filter, the sandbox's own user namespace, no inherited descriptors), then bubblewrap with
its mounts, then the program.

Every sandboxed process is started from here: the workers (``command``), the publish-time
inspector and prompt renderer (inspect.py) and the build sandbox (catalog/pyenvs.py), all through
``sandboxed``. Own user/pid/mount/ipc/uts/network namespaces, a read-only view of the OS, the
Python runtime, its site-packages and the package at neutral paths, a private sized /tmp, an empty
environment, and tenant code as an unused host uid of its own (users.py). pool.py supervises the
workers this starts.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from orsplatform.sandbox import binding, gvisor, mount_parents, seccomp, users
from orsplatform.sandbox.cgroups import WorkerCgroup
from orsplatform.sandbox.config import Limits, SandboxConfig

WORKER_MODULE = f"{binding.PACKAGE}.worker"
LAUNCH_SCRIPT = Path(__file__).with_name("launch.py")
# Where things appear inside the sandbox: neutral paths, none of the host's.
SANDBOX_WORKER = binding.module_path(WORKER_MODULE, binding.LIB)  # with the modules it shares (binding.py)
SANDBOX_PACKAGE = "/ors/env"
SANDBOX_PYTHON_HOME = "/ors/python"  # the base interpreter's prefix
SANDBOX_VENV = "/ors/venv"  # site-packages: the platform's virtualenv or the package's own
SANDBOX_PYTHON = f"{SANDBOX_VENV}/bin/python"
RUNTIME_SUFFIX = ".pyenv"
# The environment's data, read-only where OpenReward environments look for it (their documented
# data mount), for every SDK alike: a data archive stored by content hash (its folder named in
# ``<package>.data`` beside the stored package, catalog/data.py), else the package's own data/.
SANDBOX_DATA = "/orwd_data"
DATA_SUFFIX = ".data"
# Where launch.py mounts, in a mount namespace of its own, the overlays it rebinds host folders from
# (a tmpfs there; the host's folder stays empty): see launch._stage.
STAGE_ROOT = os.path.join(tempfile.gettempdir(), "ors-stage")


def runtime_of(package_dir: str) -> str | None:
    """The Python environment built for a package's requirements (catalog/pyenvs.py records it in
    ``<package>.pyenv`` beside the stored package), or None: the platform's own runtime."""
    try:
        runtime = Path(package_dir.rstrip("/") + RUNTIME_SUFFIX).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return runtime or None


def data_of(package_dir: str) -> str | None:
    """The folder mounted at /orwd_data for this package, or None."""
    try:
        data = Path(package_dir.rstrip("/") + DATA_SUFFIX).read_text(encoding="utf-8").strip()
    except OSError:
        data = ""
    if data and os.path.isdir(data):
        return data
    own = os.path.join(package_dir, "data")
    return own if os.path.isdir(own) and not os.path.islink(own) else None


def data_binds(package_dir: str) -> list[str]:
    data = data_of(package_dir)
    if data:
        users.readable(data)
    return ["--ro-bind", data, SANDBOX_DATA] if data else []


def python_of(config: SandboxConfig, runtime: str | None) -> str:
    return f"{runtime}/bin/python" if runtime else config.python


def _system_binds(runtime: str | None = None, *, python: bool = True) -> list[str]:
    """Read-only views of the OS and (`python`) the Python runtime at its host paths (merged-/usr
    symlinks kept as symlinks): the platform's virtualenv, or instead the package's own built
    environment (`runtime`), whose interpreter is the same base Python."""
    args: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    if not python:
        return args
    # The interpreter's prefix and the virtualenv (site-packages), wherever they live; nothing
    # else of their parents (a venv inside the project's tree does not expose the tree).
    seen: set[str] = set()
    prefixes = ((sys.base_prefix, runtime) if runtime else
                (sys.base_prefix, sys.prefix, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]))
    for prefix in prefixes:
        real = os.path.realpath(prefix)
        if real.startswith(("/usr/", "/bin/", "/lib/")) or real in seen or not os.path.isdir(real):
            continue
        if any(real.startswith(s + "/") for s in seen):
            continue
        seen.add(real)
        args += ["--ro-bind", real, real]
        if os.path.abspath(prefix) != real:
            args += ["--symlink", real, os.path.abspath(prefix)]
    return args


def _network_binds() -> list[str]:
    args: list[str] = []
    for etc in ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates",
                "/etc/gai.conf"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    return args


def command(config: SandboxConfig, package_dir: str, limits: Limits, cgroup: WorkerCgroup | None = None) -> list[str]:
    """The argv that starts one worker: the launcher (cgroup, rlimits, syscall filter, no inherited
    descriptors), then bubblewrap, then the interpreter (the package's built environment's when
    it has requirements)."""
    runtime = runtime_of(package_dir)
    python = python_of(config, runtime)
    if not config.isolated:
        return [*wrappers(limits), python, "-I", binding.module_path(WORKER_MODULE), package_dir, str(config.threads)]
    worker = [python, "-I", SANDBOX_WORKER, SANDBOX_PACKAGE, str(config.threads)]
    # A small package is copied into the sandbox's (read-only) root rather than bound: a bind
    # mount names its source directory (the package store's <hash>) in /proc/self/mountinfo.
    files = _package_files(package_dir)
    if files is None:
        users.readable(package_dir)
        package = ["--ro-bind", package_dir, SANDBOX_PACKAGE]
        copies: list[list[str]] = []
    else:
        dirs = sorted({str(Path(rel).parent) for rel in files} - {"."})
        package = ["--dir", SANDBOX_PACKAGE, *(a for d in dirs for a in ("--dir", f"{SANDBOX_PACKAGE}/{d}"))]
        copies = [[os.path.join(package_dir, rel), f"{SANDBOX_PACKAGE}/{rel}"] for rel in files]
    # Started in the package's folder, as `python server.py` is run from its repository: code that
    # opens its data files by relative path finds them (read-only; /tmp is where it may write).
    package += data_binds(package_dir)
    binds = binding.module_binds(binding.WORKER_MODULES)
    return sandboxed(config, limits, [*binds, *package], worker,
                     runtime=runtime, chdir=SANDBOX_PACKAGE, cgroup=cgroup, copies=copies)


COPY_MAX_FILES = 256
COPY_MAX_BYTES = 16 * 1024 * 1024


@functools.lru_cache(maxsize=256)
def _package_files(package_dir: str) -> tuple[str, ...] | None:
    """The package's files (relative paths) when it is small enough to copy into the sandbox
    (a stored package never changes, so this is worked out once), else None."""
    found: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(package_dir):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                return None  # bound as it is: a link's target is the store's business
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                return None
            total += st.st_size
            found.append(os.path.relpath(path, package_dir))
            if len(found) > COPY_MAX_FILES or total > COPY_MAX_BYTES:
                return None
    return tuple(sorted(found))


def wrappers(limits: Limits) -> list[str]:
    """rlimits (prlimit) and death with the supervisor (setpriv), for workers run without a
    sandbox (ORS_SANDBOX=none); sandboxed processes get both from the launcher."""
    prlimit = shutil.which("prlimit")
    wrapper = [prlimit, *(f"--{flag}={value}" for flag, value in _rlimit_values(limits)), "--"] if prlimit else []
    setpriv = shutil.which("setpriv")
    if setpriv:
        # Killed with its supervisor, whatever way that goes: a gateway killed with SIGKILL
        # leaves no orphaned workers.
        wrapper = [setpriv, "--pdeathsig", "KILL", "--", *wrapper]
    return wrapper


def _rlimit_values(limits: Limits) -> list[tuple[str, int]]:
    return [("as", limits.memory_bytes), ("cpu", limits.cpu_seconds), ("nproc", limits.processes),
            ("nofile", limits.open_files), ("core", 0), ("fsize", limits.tmp_bytes)]


RLIMITS = {"as": "RLIMIT_AS", "cpu": "RLIMIT_CPU", "nproc": "RLIMIT_NPROC", "nofile": "RLIMIT_NOFILE",
           "core": "RLIMIT_CORE", "fsize": "RLIMIT_FSIZE"}


def _neutral_runtime(runtime: str | None) -> tuple[list[str], list[list[str]]] | None:
    """The interpreter and its site-packages at neutral paths (/ors/python, /ors/venv): binds and
    the generated pyvenv.cfg; None when this interpreter is not laid out as a virtualenv over a
    base Python (then the host layout is used)."""
    base = os.path.realpath(sys.base_prefix)
    venv = os.path.realpath(runtime or sys.prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = Path(base, "bin", version)
    if venv == base or not interpreter.exists() or not Path(venv, "lib").is_dir():
        return None
    binds: list[str] = []
    if not base.startswith(("/usr/", "/bin/", "/lib/")) and base != "/usr":
        binds += ["--ro-bind", base, SANDBOX_PYTHON_HOME]
        # A base Python built with a shared libpython (pyenv's) finds it through an absolute
        # RUNPATH: a symlink at that path, rather than LD_LIBRARY_PATH in every process's
        # environment. It names the interpreter's prefix, not the checkout or a package.
        if any(Path(base, "lib").glob("libpython*.so*")):
            binds += ["--symlink", f"{SANDBOX_PYTHON_HOME}/lib", f"{base}/lib"]
        home = f"{SANDBOX_PYTHON_HOME}/bin"
    else:
        home = str(interpreter.parent)
    binds += ["--ro-bind", f"{venv}/lib", f"{SANDBOX_VENV}/lib",
              "--symlink", f"{home}/{version}", SANDBOX_PYTHON]
    cfg = (f"home = {home}\ninclude-system-site-packages = false\n"
           f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    return binds, [[f"{SANDBOX_VENV}/pyvenv.cfg", cfg]]


def sandboxed(config: SandboxConfig, limits: Limits, binds: list[str], argv: list[str],
              env: dict[str, str] | None = None, runtime: str | None = None, chdir: str = "/tmp", *,
              locks: bool = False, cgroup: WorkerCgroup | None = None,
              copies: list[list[str]] | None = None, owned: list[str] | None = None,
              host_uid: int | None = None, host_sockets: bool = False) -> list[str]:
    """argv run inside bubblewrap: own namespaces, read-only OS, Python and `binds`, a private /tmp
    and /dev/shm, an empty environment (but `env`), no network unless `limits` allow it, the
    syscall filter (seccomp.py; `locks` leaves file locks to the build sandbox's uv), `cgroup`
    joined before anything starts, and no descriptor of the caller but 0-2 (launch.py).
    `copies` ([host file, sandbox path]) are copied into the sandbox's read-only root; `owned`
    (host folders bound writable) are given to the sandbox's host uid (`host_uid`, by default
    one of its own: users.py) first.

    When argv runs the runtime's interpreter (`python_of`), the interpreter and its site-packages
    appear at neutral paths (/ors/python, /ors/venv) and argv[0] is rewritten to match: nothing in
    the sandbox names the host's checkout or package store."""
    files: list[list[str]] = []
    neutral = bool(argv) and argv[0] == python_of(config, runtime) and (
        runtime is not None or os.path.realpath(config.python) == os.path.realpath(sys.executable))
    runtime_binds = _neutral_runtime(runtime) if neutral else None
    if runtime_binds is not None:
        system = [*_system_binds(None, python=False), *runtime_binds[0]]
        files += runtime_binds[1]
        argv = [SANDBOX_PYTHON, *argv[1:]]
    else:
        system = _system_binds(runtime)
    spaces = users.bwrap_options(network=limits.network, disable_userns=lambda: _disable_userns(config.bwrap))
    args = [
        config.bwrap, *spaces, "--die-with-parent", "--new-session",
        "--hostname", "sandbox", "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp",
        # Few malloc arenas: the address-space limit would otherwise go to empty per-thread arenas.
        "--setenv", "MALLOC_ARENA_MAX", "2",
        # The private /tmp first: the binds that follow may live under the host's /tmp (a checkout
        # or a virtualenv there), and a tmpfs mounted after them would hide them.
        # Sticky and writable by all: the sandbox's user is not the root that mounts it.
        "--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
        *system,
        "--proc", "/proc",
        # Host-wide lock table (inode numbers and pids of every process's locks): not the tenant's.
        "--ro-bind", "/dev/null", "/proc/locks",
        *_hidden_proc(),
        # /dev read-only (bubblewrap's tmpfs is unsized) but for a sized /dev/shm.
        "--dev", "/dev", "--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        *binds,
        "--chdir", chdir,
    ]
    for name, value in (env or {}).items():
        args += ["--setenv", name, value]
    if limits.network:
        args += _network_binds()
    # The sandbox's root (a tmpfs holding the mount points) read-only too: /tmp and /dev/shm are
    # the writable places.
    args += ["--remount-ro", "/"]
    spec = {
        "parent": os.getpid(),
        "cgroups": cgroup.procs_files if cgroup is not None else [],
        "rlimits": [(RLIMITS[flag], value) for flag, value in _rlimit_values(limits)],
        "seccomp": base64.b64encode(seccomp.program(locks=locks)).decode(),
        "files": files,
        "copies": copies or [],
        "bwrap": [shutil.which(config.bwrap) or config.bwrap, *mount_parents.with_parents(args[1:])],
        # Never the host's root: an unused host uid of the sandbox's own (users.py).
        "user": users.launch_spec(owned, host_uid=host_uid),
        "argv": users.switch_argv(argv),
        # Mounting overlays takes the host's root; gVisor shows no mount's source anyway.
        "stage": STAGE_ROOT if users.dropping() else None,
    }
    if config.mode == "gvisor":
        # The same plan under gVisor's kernel (gvisor.py): no bubblewrap; the syscall filter is
        # gVisor's to apply (the tenant's calls never reach the host's kernel); the user set by the spec.
        spec["gvisor"] = gvisor.launch_entry(args[1:], argv, rlimits=spec.pop("rlimits"), network=limits.network,
                                             files=files, copies=spec.pop("copies"), host_sockets=host_sockets,
                                             locks=locks)
        del spec["bwrap"], spec["argv"], spec["seccomp"], spec["files"], spec["stage"]
    return [sys.executable, "-I", "-S", str(LAUNCH_SCRIPT), json.dumps(spec)]


# The kernel's settings and host-wide pressure (whose files take writes: PSI triggers) are none of
# tenant code's business: each is an empty, read-only folder. bubblewrap's own read-only cover of
# /proc/sys is skipped when its write check on the folder fails, as it does on procfs; binding the
# host's would show the host's namespaces' settings.
HIDDEN_PROC = ("/proc/sys", "/proc/pressure")


def _hidden_proc() -> list[str]:
    return [a for path in HIDDEN_PROC
            for a in ("--size", "4096", "--perms", "0555", "--tmpfs", path, "--remount-ro", path)]


@functools.cache
def _disable_userns(bwrap: str) -> bool:
    """Can this bubblewrap use --disable-userns here (0.8+, and a user namespace it may make)? The
    syscall filter refuses new user namespaces either way; this also caps them in the kernel."""
    try:
        done = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/",
                               "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
