"""Python environments built for packages' requirements, one per resolved requirement set.

A package that lists requirements (catalog/requirements.py) runs with a virtualenv of its own:
the platform's pinned SDKs and orjson, plus what it asks for, installed by uv. uv installs
hard links from one cache (``ORS_UV_CACHE_DIR``), so a package shared by many environments costs
its disk once. Identical sets share one environment: the declared set is looked up first (no
installer runs at all), then the resolved set (``uv pip compile``) names the environment's folder,
``ORS_PYENV_DIR/<sha256 of the resolved set>``.

Every uv run happens in the sandbox (runners/sandbox/build.py): no network but the registry
proxy (registry_proxy.py), a time limit, an address-space and a file-size limit, and wheels only
(``--no-build``): no setup.py of any package runs, so nothing a tenant chose executes during a
build and the shared cache cannot be poisoned by one. Its output comes back over a pipe and the
platform writes it to the version's build log (up to BUILD_OUTPUT_BYTES a run); what the platform
reads back from the environments' folder, which the build sandbox may write, goes through
sandbox/untrusted_files.py (no links, no FIFOs, capped).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uv
from django.conf import settings

from orsplatform.catalog.requirements import platform_pins
from orsplatform.runners import inspection
from orsplatform.runners.sandbox import untrusted_files
from orsplatform.runners.sandbox.config import Limits, SandboxConfig
from orsplatform.runners.sandbox.pool import RUNTIME_SUFFIX, sandboxed

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "runners" / "sandbox" / "build.py"
SANDBOX_BUILD_SCRIPT = "/ors/build.py"
COMPLETE = ".complete"  # written last: a folder without it is a build that did not finish
MiB = 1024 * 1024
BUILD_OUTPUT_BYTES = MiB  # of the installer's output kept in the build log, per run
LOG_TAIL_BYTES = 16384
# How environments are built (wheels only, bytecode compiled): part of every key, so environments
# built another way are never reused for a new build.
LAYOUT = "wheels-only,bytecode"


class BuildFailed(Exception):
    """The installer failed; the message is its own last lines."""


@dataclass(frozen=True)
class Built:
    path: Path
    reused: bool  # an existing environment served (no install ran)
    total_bytes: int  # every file of the environment
    own_bytes: int  # files not hard-linked from uv's cache (what the environment adds to the disk)


class BuildLog:
    """The build's output, appended to a file that the console and the REST API show the tail of."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")


def log_path(version_id: int) -> Path:
    return settings.ORS_BUILD_LOG_DIR / f"version-{version_id}.log"


def scrub(text: str) -> str:
    """The build's words without the host's paths (tenants see the log and the error)."""
    for path, name in ((settings.ORS_PYENV_DIR, "<environments>"), (settings.BASE_DIR, "<platform>"),
                       (Path(sys.base_prefix), "<python>")):
        text = text.replace(str(Path(path).resolve()), name).replace(str(path), name)
    return text


def _log_end(path: Path) -> str:
    try:
        return untrusted_files.tail(path.parent, path.name, limit=LOG_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def log_tail(version_id: int, lines: int = 40) -> str:
    return scrub("\n".join(_log_end(log_path(version_id)).splitlines()[-lines:]))


class _InstallerOutput:
    """The installer's output into the build log, line by line and up to BUILD_OUTPUT_BYTES: the
    platform writes the log the author is shown, never the sandboxed process."""

    def __init__(self, log: BuildLog) -> None:
        self.log = log
        self.kept = 0
        self.partial = b""
        self.dropped = False

    def __call__(self, chunk: bytes) -> None:
        room = BUILD_OUTPUT_BYTES - self.kept
        if len(chunk) > room:
            self.dropped = True
            chunk = chunk[:room]
        if not chunk:
            return
        self.kept += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        if lines:
            self.log.write("\n".join(map(self._line, lines)))

    @staticmethod
    def _line(raw: bytes) -> str:
        line = raw.decode("utf-8", "replace")
        return " " + line if line.startswith("[platform]") else line  # only the platform speaks as it

    def close(self) -> None:
        if self.partial:
            self.log.write(self._line(self.partial))
        if self.dropped:
            self.log.write(f"[platform] the installer's further output was not kept (over {BUILD_OUTPUT_BYTES // MiB} MiB)")


def log_age_seconds(version_id: int) -> float:
    """Seconds since the build last wrote to its log (infinite when it has none)."""
    try:
        return time.time() - log_path(version_id).stat().st_mtime
    except OSError:
        return float("inf")


def _base_python() -> str:
    """The interpreter every built environment is made from: the one under the platform's venv."""
    return os.path.realpath(sys.executable)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _declared_key(requirements: list[str]) -> str:
    return _digest("\n".join([sys.version.split()[0], LAYOUT, *platform_pins(), "--", *requirements]))


def _root() -> Path:
    root = settings.ORS_PYENV_DIR
    (root / "declared").mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One build of a set at a time (publishes of the same requirements wait for the first)."""
    with open(_root() / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _usage(path: Path) -> tuple[int, int]:
    total = own = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size
            if st.st_nlink == 1:
                own += st.st_size
    return total, own


def _ready(path: Path) -> bool:
    try:  # lstat: the marker itself, never what a link planted in its place points at
        return stat.S_ISREG(os.lstat(path / COMPLETE).st_mode)
    except OSError:
        return False


def _read_small(root: Path, relative: str) -> str:
    """A platform file in the environments' folder, which the build sandbox can write."""
    return untrusted_files.read_text(root, relative, limit=4096).strip()


def _run(commands: list[list[str]], *, work: Path, log: BuildLog) -> None:
    """Run uv commands in the build sandbox, their output appended to the log."""
    from orsplatform.runners.sandbox.registry_proxy import RegistryProxy

    cache = settings.ORS_UV_CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    config = SandboxConfig.from_django(threads=1)
    disk = settings.ORS_BUILD_DISK_MB * MiB
    limits = Limits(memory_bytes=settings.ORS_BUILD_MEMORY_MB * MiB, cpu_seconds=int(settings.ORS_BUILD_TIMEOUT_SECONDS),
                    processes=512, open_files=4096, tmp_bytes=disk)
    env = {"UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
           "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "hardlink", "NO_COLOR": "1",
           "UV_INDEX_URL": settings.ORS_BUILD_INDEX_URL, "UV_HTTP_TIMEOUT": "60",
           "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    socket_path = work / "registry.sock"
    # The environments' folder is one writable mount, holding the work folder, the environment
    # being built and (by default) the cache: hard links do not cross mount points. Only uv runs
    # in here (wheels only), never a package's code.
    root = settings.ORS_PYENV_DIR
    all_binds = ["--bind", str(root), str(root), "--ro-bind", str(BUILD_SCRIPT), SANDBOX_BUILD_SCRIPT]
    if not cache.resolve().is_relative_to(root.resolve()):
        all_binds += ["--bind", str(cache), str(cache)]
    for etc in ("/etc/ssl", "/etc/ca-certificates"):
        if os.path.exists(etc):
            all_binds += ["--ro-bind", etc, etc]
    argv = [_base_python(), "-I", SANDBOX_BUILD_SCRIPT, str(socket_path), json.dumps(commands)]
    if config.isolated:
        cmd = sandboxed(config, limits, all_binds, argv, env, locks=True)  # uv guards its shared cache with locks
    else:  # ORS_SANDBOX=none: tenants are not isolated anyway; the installer runs as it is
        cmd = [sys.executable, "-I", str(BUILD_SCRIPT), str(socket_path), json.dumps(commands)]
    allowed = set(settings.ORS_BUILD_ALLOWED_HOSTS)
    timeout = settings.ORS_BUILD_TIMEOUT_SECONDS
    output = _InstallerOutput(log)
    with RegistryProxy(socket_path, allowed, log.write):
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=str(work), start_new_session=True, close_fds=True,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env if not config.isolated else {})})
        try:
            exited = inspection.supervise(proc, timeout=timeout, sinks={proc.stdout: output}).exited
        finally:
            inspection.kill_group(proc.pid)
            proc.wait()
            proc.stdout.close()
            output.close()
    if not exited:
        raise BuildFailed(f"The installer did not finish within {timeout:g} s and was stopped.")
    if proc.returncode != 0:
        raise BuildFailed(_installer_message(log))


def _installer_message(log: BuildLog) -> str:
    """uv's own explanation: its last non-empty lines (it prints the reason last)."""
    lines = [ln.strip() for ln in _log_end(log.path).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith("[platform] $")][-6:]
    return scrub(" ".join(useful))[-1500:] or "The installer failed without a message."


def _resolve(requirements: list[str], work: Path, log: BuildLog) -> str:
    (work / "requirements.in").write_text("\n".join([*platform_pins(), *requirements]) + "\n")
    command = [uv.find_uv_bin(), "pip", "compile", "--no-build", "--python", _base_python(),
               "--no-header", "--no-annotate", "--output-file", str(work / "resolved.txt"), str(work / "requirements.in")]
    log.write("[platform] $ uv pip compile (resolving " + ", ".join(requirements) + ")")
    _run([command], work=work, log=log)
    try:
        return untrusted_files.read_text(_root(), f"{work.name}/resolved.txt", limit=MiB)
    except OSError as exc:
        raise BuildFailed(f"The resolver's output could not be read ({exc.strerror}).") from None


def _install(path: Path, work: Path, log: BuildLog) -> None:
    path.mkdir(parents=True)
    commands = [
        [uv.find_uv_bin(), "venv", "--quiet", "--allow-existing", "--python", _base_python(), str(path)],
        # Compiled here, once: the sandbox mounts the environment read-only, so a worker could
        # never write the .pyc files and would compile every module it imports at each start
        # (tens of seconds for an SDK such as openenv's). Compiling runs no package code.
        [uv.find_uv_bin(), "pip", "sync", "--no-build", "--compile-bytecode", "--python", f"{path}/bin/python",
         str(work / "resolved.txt")],
    ]
    log.write(f"[platform] $ uv venv && uv pip sync into {path.name}")
    _run(commands, work=work, log=log)
    total = _usage(path)[0]
    if total > settings.ORS_BUILD_DISK_MB * MiB:
        raise BuildFailed(f"The environment takes {total // MiB} MiB; the limit is {settings.ORS_BUILD_DISK_MB} MiB.")
    (path / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def ensure(requirements: list[str], log: BuildLog) -> Built:
    """The built environment for ``requirements``, building it when no identical set has been."""
    root = _root()
    declared = root / "declared" / _declared_key(requirements)
    with contextlib.suppress(OSError):
        path = root / _read_small(root, f"declared/{declared.name}")
        if path.parent == root and _ready(path):
            log.write(f"[platform] requirements already built: reusing environment {path.name[:12]}")
            return Built(path, True, *_usage(path))
    work = root / f"work-{uuid.uuid4().hex[:12]}"
    work.mkdir()
    try:
        resolved = _resolve(requirements, work, log)
        key = _digest(f"{LAYOUT}\n{resolved}")
        path = root / key
        with _locked(key):
            if _ready(path):
                log.write(f"[platform] resolved set already built: reusing environment {key[:12]}")
                reused = True
            else:
                shutil.rmtree(path, ignore_errors=True)  # a build that died half-way
                try:
                    _install(path, work, log)
                except BaseException:
                    shutil.rmtree(path, ignore_errors=True)
                    raise
                reused = False
        declared.write_text(key)
        total, own = _usage(path)
        log.write(f"[platform] environment {key[:12]} ready: {total // MiB} MiB of files, "
                  f"{own // MiB} MiB not shared with uv's cache")
        return Built(path, reused, total, own)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def record_runtime(package_path: str, runtime: Path | None) -> None:
    """Tell the sandbox pool which interpreter runs the stored package (sandbox/pool.runtime_of)."""
    marker = Path(package_path.rstrip("/") + RUNTIME_SUFFIX)
    if runtime is None:
        marker.unlink(missing_ok=True)
        return
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(str(runtime))
    tmp.replace(marker)


def collect(keep: set[str], *, grace_seconds: float) -> list[str]:
    """Remove built environments whose key is not in ``keep`` (and older than the grace, so a build
    in progress is never taken away); returns the keys removed."""
    root = _root()
    now = time.time()
    removed = []
    for path in root.iterdir():
        if not path.is_dir() or path.name in ("declared", settings.ORS_UV_CACHE_DIR.name) or path.name in keep:
            continue
        if now - path.stat().st_mtime < grace_seconds:
            continue
        shutil.rmtree(path, ignore_errors=True)
        (root / f"{path.name}.lock").unlink(missing_ok=True)
        removed.append(path.name)
    for entry in (root / "declared").iterdir():
        with contextlib.suppress(OSError):
            if not (root / _read_small(root, f"declared/{entry.name}")).is_dir():
                entry.unlink()
    return removed
