"""Python environments built for packages' requirements, one per resolved requirement set.

A package that lists requirements (catalog/requirements.py) runs with a virtualenv of its own:
the platform's pinned SDKs and orjson, plus what it asks for, installed by uv. uv installs
hard links from one cache (``ORS_UV_CACHE_DIR``), so a package shared by many environments costs
its disk once. Identical sets share one environment: the declared set is looked up first (no
installer runs at all), then the resolved set (``uv pip compile``) names the environment's folder,
``ORS_PYENV_DIR/<sha256 of the resolved set>``.

Every uv run happens in the sandbox (sandbox/build.py): no network but the registry
proxy (registry_proxy.py), a time limit, an address-space and a file-size limit, and wheels only
(``--no-build``): no setup.py of any package runs there, so the shared cache cannot be poisoned.
A requirement published only as a source distribution (the wheels-only resolve names it,
catalog/sdists.py) is built into a wheel first, by ``uv build`` in a sandbox of its own: its
cgroup, a throwaway uv cache on the sandbox's sized /tmp, no view of the shared cache or the
environments' folder (only its own folder, holding the sdist and an empty output folder), and the
same proxy. Only the one wheel it leaves is taken (sdists.built_wheel), resolved from a
``--find-links`` folder and installed without the shared cache (``--no-cache``). Its output comes back over a pipe and the
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
import re
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
from packaging.utils import canonicalize_name

from orsplatform.catalog import sdists
from orsplatform.catalog.requirements import platform_pins
from orsplatform.executors import inspection
from orsplatform.sandbox import untrusted_files, users
from orsplatform.sandbox.bwrap import RUNTIME_SUFFIX, sandboxed
from orsplatform.sandbox.config import Limits, SandboxConfig

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "sandbox" / "build.py"
SANDBOX_BUILD_SCRIPT = "/ors/build.py"
SANDBOX_SOURCE_BUILD = "/build"  # a source build's own folder, inside its sandbox
COMPLETE = ".complete"  # written last: a folder without it is a build that did not finish
MiB = 1024 * 1024
BUILD_OUTPUT_BYTES = MiB  # of the installer's output kept in the build log, per run
LOG_TAIL_BYTES = 16384
OUTPUT_TAIL_BYTES = 65536
# How environments are built (wheels only, bytecode compiled): part of every key, so environments
# built another way are never reused for a new build.
LAYOUT = "wheels-only,bytecode"


class BuildFailed(Exception):
    """The installer failed; the message is its own last lines."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output  # the end of the installer's output (what it failed on)


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
        self.recent = b""  # the output's end, for reading what the installer failed on

    def __call__(self, chunk: bytes) -> None:
        room = BUILD_OUTPUT_BYTES - self.kept
        if len(chunk) > room:
            self.dropped = True
            chunk = chunk[:room]
        if not chunk:
            return
        self.recent = (self.recent + chunk)[-OUTPUT_TAIL_BYTES:]
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


def _installer_env(cache: Path) -> dict[str, str]:
    """uv's environment: the shared cache, no configuration or interpreter downloads of its own, the
    platform's indexes (reached through the registry proxy)."""
    env = {"UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
           "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "hardlink", "NO_COLOR": "1",
           "UV_INDEX_URL": settings.ORS_BUILD_INDEX_URL, "UV_HTTP_TIMEOUT": "60",
           "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    if settings.ORS_BUILD_EXTRA_INDEX_URLS:
        env["UV_EXTRA_INDEX_URL"] = " ".join(settings.ORS_BUILD_EXTRA_INDEX_URLS)
    return env


def _run(commands: list[list[str]], *, work: Path, log: BuildLog, private: Path | None = None) -> str:
    """Run uv commands in the build sandbox, their output appended to the log (and the end of it
    returned). ``private``: a source build, in a sandbox that sees only that folder (writable),
    with a throwaway cache in its /tmp and a cgroup of its own."""
    from orsplatform.sandbox.cgroups import WorkerCgroup
    from orsplatform.sandbox.registry_proxy import RegistryProxy, index_origins

    cache = settings.ORS_UV_CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    config = SandboxConfig.from_settings(settings, threads=1)
    disk = settings.ORS_BUILD_DISK_MB * MiB
    limits = Limits(memory_bytes=settings.ORS_BUILD_MEMORY_MB * MiB, cpu_seconds=int(settings.ORS_BUILD_TIMEOUT_SECONDS),
                    processes=512, open_files=4096, tmp_bytes=disk)
    env = _installer_env(cache)
    tls, plain = index_origins([settings.ORS_BUILD_INDEX_URL, *settings.ORS_BUILD_EXTRA_INDEX_URLS])
    cgroup = None
    if private is None:
        socket_path = work / "registry.sock"
        # The environments' folder is one writable mount, holding the work folder, the environment
        # being built and (by default) the cache: hard links do not cross mount points. Only uv
        # runs in here (wheels only), never a package's code.
        root = settings.ORS_PYENV_DIR
        all_binds = ["--bind", str(root), str(root), "--ro-bind", str(BUILD_SCRIPT), SANDBOX_BUILD_SCRIPT]
        writable = [str(root)]
        if not cache.resolve().is_relative_to(root.resolve()):
            all_binds += ["--bind", str(cache), str(cache)]
            writable.append(str(cache))
    else:
        # A package's own build code runs here: it sees its folder and nothing of the platform's
        # (no shared cache, no environments), and its cache is thrown away with the sandbox's /tmp.
        socket_path = private / "registry.sock"
        env.update(UV_CACHE_DIR="/tmp/uv-cache", UV_LINK_MODE="copy")
        # At a neutral path: not even the environments' folder's name is in there.
        all_binds = ["--bind", str(private), SANDBOX_SOURCE_BUILD, "--ro-bind", str(BUILD_SCRIPT), SANDBOX_BUILD_SCRIPT]
        writable = [str(private)]
        if config.isolated:
            commands = [[a.replace(str(private), SANDBOX_SOURCE_BUILD) for a in argv] for argv in commands]
            cgroup = WorkerCgroup.create(memory_bytes=limits.memory_bytes, processes=limits.processes,
                                         cpu_weight=config.cpu_weight, runtime=config.mode)
    for etc in ("/etc/ssl", "/etc/ca-certificates"):
        if os.path.exists(etc):
            all_binds += ["--ro-bind", etc, etc]
    inside = f"{SANDBOX_SOURCE_BUILD}/registry.sock" if private is not None else str(socket_path)
    argv = [_base_python(), "-I", SANDBOX_BUILD_SCRIPT, inside, json.dumps(commands)]
    if config.isolated:  # uv guards its caches with locks
        # Never as root: the installer as the range's fixed uid, a package's build code as one of
        # its own; each given the folders it writes (sandbox/users.py).
        cmd = sandboxed(config, limits, all_binds, argv, env, locks=True, cgroup=cgroup, host_sockets=True,
                        chdir=SANDBOX_SOURCE_BUILD if private is not None else "/tmp", owned=writable,
                        host_uid=None if private is not None else users.INSTALLER_UID)
    else:  # ORS_SANDBOX=none: tenants are not isolated anyway; the installer runs as it is
        cmd = [sys.executable, "-I", str(BUILD_SCRIPT), str(socket_path), json.dumps(commands)]
        if private is not None:
            env["UV_CACHE_DIR"] = str(private / "uv-cache")
    allowed = set(settings.ORS_BUILD_ALLOWED_HOSTS)
    timeout = settings.ORS_BUILD_TIMEOUT_SECONDS
    output = _InstallerOutput(log)
    with RegistryProxy(socket_path, allowed, log.write, tls_origins=tls, http_origins=plain):
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=str(work), start_new_session=True, close_fds=True,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env if not config.isolated else {})})
        try:
            exited = inspection.supervise(proc, timeout=timeout, sinks={proc.stdout: output}).exited
        finally:
            inspection.kill_group(proc.pid)
            if cgroup is not None:
                cgroup.kill()
            proc.wait()
            proc.stdout.close()
            output.close()
            if cgroup is not None:
                _remove_cgroup(cgroup)
    recent = output.recent.decode("utf-8", "replace")
    if not exited:
        raise BuildFailed(f"The installer did not finish within {timeout:g} s and was stopped.", recent)
    if cgroup is not None and cgroup.oom_kills():
        raise BuildFailed(f"The build ran out of memory (ORS_BUILD_MEMORY_MB = {settings.ORS_BUILD_MEMORY_MB}).", recent)
    if proc.returncode != 0:
        raise BuildFailed(_installer_message(log), recent)
    return recent


def _remove_cgroup(cgroup) -> None:
    """Its processes were killed; the kernel takes a moment to let them go."""
    deadline = time.monotonic() + 10
    while not cgroup.remove() and time.monotonic() < deadline:
        cgroup.kill()
        time.sleep(0.05)


def _installer_message(log: BuildLog) -> str:
    """uv's own explanation: its last non-empty lines (it prints the reason last)."""
    lines = [ln.strip() for ln in _log_end(log.path).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith("[platform] $")][-6:]
    return scrub(" ".join(useful))[-1500:] or "The installer failed without a message."


def _resolve(requirements: list[str], work: Path, log: BuildLog) -> tuple[str, dict[str, str]]:
    """The resolved set (uv pip compile's output), and the wheels built from source distributions
    for it (canonical name -> file name in ``work/wheels``)."""
    (work / "requirements.in").write_text("\n".join([*platform_pins(), *requirements]) + "\n")
    wheels = work / "wheels"
    built: dict[str, str] = {}
    while True:
        command = [uv.find_uv_bin(), "pip", "compile", "--no-build", "--python", _base_python(),
                   "--no-header", "--no-annotate", "--output-file", str(work / "resolved.txt")]
        if built:
            command += ["--find-links", str(wheels)]
        log.write("[platform] $ uv pip compile (resolving " + ", ".join(requirements) + ")")
        try:
            _run([[*command, str(work / "requirements.in")]], work=work, log=log)
            break
        except BuildFailed as exc:
            missing = {n: v for n, v in sdists.wanted(exc.output).items() if n not in built}
            if not missing or not settings.ORS_BUILD_SDISTS:
                raise
            if len(built) + len(missing) > settings.ORS_BUILD_MAX_SDISTS:
                raise BuildFailed(f"{', '.join(missing)}: more than {settings.ORS_BUILD_MAX_SDISTS} requirements "
                                  "need building from source (ORS_BUILD_MAX_SDISTS).") from None
            for name, version in missing.items():
                built[name] = _build_sdist(name, version, requirements, work, log)
    try:
        return untrusted_files.read_text(_root(), f"{work.name}/resolved.txt", limit=MiB), built
    except OSError as exc:
        raise BuildFailed(f"The resolver's output could not be read ({exc.strerror}).") from None


def _build_sdist(name: str, version: str | None, requirements: list[str], work: Path, log: BuildLog) -> str:
    """Build ``name``'s source distribution into a wheel in a sandbox of its own; the wheel's file
    name in ``work/wheels``. Failures name the package and say what the build said."""
    try:
        sdist = sdists.find(name, version, requirements)
        private = work / f"sdist-{sdist.name}"
        (private / "out").mkdir(parents=True)
        source = sdists.download(sdist, private)
    except sdists.SdistError as exc:
        raise BuildFailed(f"{exc}.") from None
    log.write(f"[platform] $ uv build {sdist.filename} ({sdist.name} {sdist.version} has no wheel: building it "
              "from its source distribution in a sandbox of its own, with a private cache)")
    started = time.monotonic()
    command = [uv.find_uv_bin(), "build", "--wheel", "--python", _base_python(), "--out-dir", str(private / "out"),
               str(source)]
    try:
        _run([command], work=work, log=log, private=private)
        filename, data = sdists.built_wheel(sdist, private / "out", settings.ORS_BUILD_DISK_MB * MiB)
    except BuildFailed as exc:
        raise BuildFailed(f"Building {sdist.name} {sdist.version} from its source distribution failed: {exc}",
                          exc.output) from None
    except sdists.SdistError as exc:
        raise BuildFailed(f"{exc}.") from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    (work / "wheels").mkdir(exist_ok=True)
    (work / "wheels" / filename).write_bytes(data)
    log.write(f"[platform] built {filename} ({len(data) // 1024} KiB, sha256 {hashlib.sha256(data).hexdigest()[:12]}) "
              f"in {time.monotonic() - started:.1f} s")
    return filename


def _without(resolved: str, names: set[str]) -> str:
    """The resolved set less the packages built from source (installed from their wheels)."""
    kept = []
    for line in resolved.splitlines():
        name = re.split(r"[=<>!~;\[ ]", line.strip(), maxsplit=1)[0]
        if not name or canonicalize_name(name) not in names:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _install(path: Path, work: Path, log: BuildLog, built: dict[str, str]) -> None:
    path.mkdir(parents=True)
    resolved = work / "resolved.txt"
    if built:
        resolved = work / "resolved-index.txt"
        resolved.write_text(_without(untrusted_files.read_text(work, "resolved.txt", limit=MiB), set(built)))
    commands = [
        [uv.find_uv_bin(), "venv", "--quiet", "--allow-existing", "--python", _base_python(), str(path)],
        # Compiled here, once: the sandbox mounts the environment read-only, so a worker could
        # never write the .pyc files and would compile every module it imports at each start
        # (tens of seconds for an SDK such as openenv's). Compiling runs no package code.
        [uv.find_uv_bin(), "pip", "sync", "--no-build", "--compile-bytecode", "--python", f"{path}/bin/python",
         str(resolved)],
    ]
    if built:
        # The wheels built from source go in without the shared cache: copied, never cached.
        commands.append([uv.find_uv_bin(), "pip", "install", "--no-deps", "--no-index", "--no-cache", "--compile-bytecode",
                         "--link-mode", "copy", "--python", f"{path}/bin/python",
                         *(str(work / "wheels" / f) for f in sorted(built.values()))])
    log.write(f"[platform] $ uv venv && uv pip sync into {path.name}"
              + (f" (and the wheels built from source: {', '.join(sorted(built.values()))})" if built else ""))
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
        resolved, built = _resolve(requirements, work, log)
        # Wheels built from source are part of what the environment is (a rebuild need not match).
        key = _digest(f"{LAYOUT}\n{resolved}" + "".join(
            f"{f} {hashlib.sha256((work / 'wheels' / f).read_bytes()).hexdigest()}\n" for f in sorted(built.values())))
        path = root / key
        with _locked(key):
            if _ready(path):
                log.write(f"[platform] resolved set already built: reusing environment {key[:12]}")
                reused = True
            else:
                shutil.rmtree(path, ignore_errors=True)  # a build that died half-way
                try:
                    _install(path, work, log, built)
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
    """Tell the sandbox pool which interpreter runs the stored package (sandbox/bwrap.runtime_of)."""
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
