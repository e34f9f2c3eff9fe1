"""What a sandbox worker may use: the operator's settings and an environment manifest's requests.

No Django here: runner nodes build this from their environment (`SandboxConfig.from_env`), a gateway
from settings.py (whose ORS_SANDBOX_* names are the same variables with the same defaults, see
`DEFAULTS`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orsplatform.sandbox import gvisor
from orsplatform.sandbox.gvisor import GVISOR_DEFAULTS

MiB = 1024 * 1024

# Operator settings (environment variable -> default). settings.py reads the same names.
DEFAULTS: dict[str, Any] = {
    # auto | gvisor | bwrap | none. auto: gVisor where runsc can start a sandbox here, else bubblewrap
    # (said at start, with why); none: worker processes without isolation (said at every start).
    "ORS_SANDBOX": "auto",
    "ORS_SANDBOX_BWRAP": "bwrap",
    **GVISOR_DEFAULTS,  # ORS_GVISOR_RUNSC, ORS_GVISOR_PLATFORM (docs/gvisor.md)
    "ORS_SANDBOX_ALLOW_NETWORK": False,  # may a manifest ask for outbound network access?
    "ORS_SANDBOX_SESSIONS_PER_WORKER": 64,  # more sessions of one (version, team) start another worker
    "ORS_SANDBOX_MAX_WORKERS_PER_KEY": 8,
    "ORS_SANDBOX_IDLE_SECONDS": 120.0,  # a worker without sessions for this long is retired
    "ORS_SANDBOX_GRACE_SECONDS": 5.0,  # a call this far past its timeout gets its worker killed
    "ORS_SANDBOX_START_SECONDS": 60.0,  # a worker not ready after this long is killed
    # Limits a manifest may ask for ([sandbox] memory_mb, cpu_seconds, processes, open_files,
    # tmp_mb), up to the operator's maxima; the defaults apply when it asks for nothing.
    "ORS_SANDBOX_MEMORY_MB": 1024, "ORS_SANDBOX_MAX_MEMORY_MB": 4096,
    "ORS_SANDBOX_CPU_SECONDS": 3600, "ORS_SANDBOX_MAX_CPU_SECONDS": 24 * 3600,
    "ORS_SANDBOX_PROCESSES": 256, "ORS_SANDBOX_MAX_PROCESSES": 1024,
    "ORS_SANDBOX_OPEN_FILES": 1024, "ORS_SANDBOX_MAX_OPEN_FILES": 8192,
    "ORS_SANDBOX_TMP_MB": 256, "ORS_SANDBOX_MAX_TMP_MB": 4096,
    # Each worker's CPU weight in its cgroup (cgroup v2 cpu.weight scale, 1-10000; v1 cpu.shares is
    # weight * 1024 / 100): the same for every worker, so CPU is shared per worker, not per process.
    "ORS_SANDBOX_CPU_WEIGHT": 100,
    # The weight of all workers together (their parent cgroup, same scale) against the platform's own
    # processes, which weigh 100 each: under contention the gateway or runner that serves every team
    # runs first, so one tenant's burn cannot slow another team's calls through it (docs/sandbox.md;
    # bench/tenant_noise.py). Idle CPU is never withheld: weights only count under contention.
    "ORS_SANDBOX_TOTAL_CPU_WEIGHT": 25,
    # A worker that used at least this share of one CPU over the last half second is busy: its
    # weight drops to ORS_SANDBOX_BUSY_CPU_WEIGHT until it has been below that share for a second,
    # so a tenant burning CPU yields to the calm workers of every other team (0 turns this off).
    "ORS_SANDBOX_BUSY_CPU": 0.5,
    "ORS_SANDBOX_BUSY_CPU_WEIGHT": 1,
    # ...and its cgroup is made idle (cpu.idle 1, where the kernel has it: scheduled like
    # SCHED_IDLE, so a calm worker waking on its CPU preempts it at once).
    "ORS_SANDBOX_BUSY_CPU_IDLE": True,
}


class SandboxUnavailable(Exception):
    """No sandbox tool can run here and ORS_SANDBOX=none was not set."""


def _typed(name: str, raw: str | None) -> Any:
    default = DEFAULTS[name]
    if raw is None or raw == "":
        return default
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return type(default)(raw)


def env_setting(name: str) -> Any:
    return _typed(name, os.environ.get(name))


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpu_seconds: int
    processes: int
    open_files: int
    tmp_bytes: int
    network: bool = False


@dataclass(frozen=True)
class SandboxConfig:
    mode: str = "bwrap"
    bwrap: str = "bwrap"
    threads: int = 64
    allow_network: bool = False
    sessions_per_worker: int = 64
    max_workers_per_key: int = 8
    idle_seconds: float = 120.0
    grace_seconds: float = 5.0
    start_seconds: float = 60.0
    defaults: Limits = Limits(1024 * MiB, 3600, 256, 1024, 256 * MiB)
    maxima: Limits = Limits(4096 * MiB, 24 * 3600, 1024, 8192, 4096 * MiB)
    python: str = sys.executable
    cpu_weight: int = 100
    total_cpu_weight: int = 25
    busy_cpu: float = 0.5
    busy_cpu_weight: int = 1
    busy_cpu_idle: bool = True

    @classmethod
    def from_values(cls, get, *, threads: int) -> SandboxConfig:
        """From a lookup of the ORS_SANDBOX_* names (os.environ, or Django settings)."""
        return cls(
            mode=resolve_mode(str(get("ORS_SANDBOX")).lower()), bwrap=get("ORS_SANDBOX_BWRAP"), threads=threads,
            allow_network=get("ORS_SANDBOX_ALLOW_NETWORK"),
            sessions_per_worker=get("ORS_SANDBOX_SESSIONS_PER_WORKER"),
            max_workers_per_key=get("ORS_SANDBOX_MAX_WORKERS_PER_KEY"),
            idle_seconds=get("ORS_SANDBOX_IDLE_SECONDS"), grace_seconds=get("ORS_SANDBOX_GRACE_SECONDS"),
            start_seconds=get("ORS_SANDBOX_START_SECONDS"), cpu_weight=get("ORS_SANDBOX_CPU_WEIGHT"),
            total_cpu_weight=get("ORS_SANDBOX_TOTAL_CPU_WEIGHT"),
            busy_cpu=get("ORS_SANDBOX_BUSY_CPU"), busy_cpu_weight=get("ORS_SANDBOX_BUSY_CPU_WEIGHT"),
            busy_cpu_idle=get("ORS_SANDBOX_BUSY_CPU_IDLE"),
            defaults=Limits(get("ORS_SANDBOX_MEMORY_MB") * MiB, get("ORS_SANDBOX_CPU_SECONDS"),
                            get("ORS_SANDBOX_PROCESSES"), get("ORS_SANDBOX_OPEN_FILES"), get("ORS_SANDBOX_TMP_MB") * MiB),
            maxima=Limits(get("ORS_SANDBOX_MAX_MEMORY_MB") * MiB, get("ORS_SANDBOX_MAX_CPU_SECONDS"),
                          get("ORS_SANDBOX_MAX_PROCESSES"), get("ORS_SANDBOX_MAX_OPEN_FILES"),
                          get("ORS_SANDBOX_MAX_TMP_MB") * MiB),
        )

    @classmethod
    def from_env(cls, *, threads: int) -> SandboxConfig:
        return cls.from_values(env_setting, threads=threads)

    @classmethod
    def from_settings(cls, settings: Any, *, threads: int) -> SandboxConfig:
        """From a settings object (Django's, passed by the caller: this package imports no Django),
        with the defaults for the names it does not set."""
        return cls.from_values(lambda name: getattr(settings, name, DEFAULTS[name]), threads=threads)

    @property
    def isolated(self) -> bool:
        return self.mode != "none"

    def with_mode(self, mode: str) -> SandboxConfig:
        return replace(self, mode=mode)

    def limits_for(self, package_dir: str) -> Limits:
        """The package manifest's [sandbox] requests, within the operator's maxima. A request for
        network access the operator does not allow raises PermissionError (the session fails
        setup saying so, rather than running an environment that expects a network without one)."""
        wanted = read_manifest_sandbox(package_dir)
        d, m = self.defaults, self.maxima

        def pick(key: str, default: int, maximum: int, scale: int = 1) -> int:
            value = wanted.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                return default
            return min(value * scale, maximum)

        network = bool(wanted.get("network", False))
        if network and not self.allow_network:
            raise PermissionError("The environment's manifest asks for network access, which this platform's "
                                  "operator does not allow (ORS_SANDBOX_ALLOW_NETWORK).")
        return Limits(memory_bytes=pick("memory_mb", d.memory_bytes, m.memory_bytes, MiB),
                      cpu_seconds=pick("cpu_seconds", d.cpu_seconds, m.cpu_seconds),
                      processes=pick("processes", d.processes, m.processes),
                      open_files=pick("open_files", d.open_files, m.open_files),
                      tmp_bytes=pick("tmp_mb", d.tmp_bytes, m.tmp_bytes, MiB), network=network)


def read_manifest_sandbox(package_dir: str) -> dict:
    path = Path(package_dir) / "manifest.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    section = data.get("sandbox", {})
    return section if isinstance(section, dict) else {}


RUNTIMES = ("gvisor", "bwrap")


def resolve_mode(mode: str) -> str:
    """ORS_SANDBOX's runtime: `auto` is gVisor when runsc can start a sandbox here (one probe per
    process), else bubblewrap; `fallback_reason` says why it fell back."""
    if mode != "auto":
        return mode
    return "gvisor" if gvisor.gvisor_problem() is None else "bwrap"


def fallback_reason(config_mode: str, asked: str) -> str | None:
    """Why `asked` (ORS_SANDBOX) resolved to bubblewrap rather than gVisor, or None."""
    if asked != "auto" or config_mode != "bwrap":
        return None
    return gvisor.gvisor_problem()


def probe(config: SandboxConfig) -> str | None:
    """Why the configured sandbox cannot run here (None: it can). Runs bwrap (and for gVisor, runsc)
    once with the namespaces a worker gets (once per process and path)."""
    if not config.isolated:
        return None
    if config.mode not in RUNTIMES:
        return (f"Unknown ORS_SANDBOX {config.mode!r} (use auto, gvisor, bwrap, or none to run tenants "
                "without isolation).")
    if config.mode == "gvisor":
        return gvisor.gvisor_problem()
    from orsplatform.sandbox import seccomp  # its filter is part of the sandbox

    return _probe_bwrap(config.bwrap) or seccomp.available()


@functools.cache
def _probe_bwrap(bwrap: str) -> str | None:
    binary = shutil.which(bwrap)
    if binary is None:
        return f"bubblewrap ({bwrap!r}) is not installed (Debian: apt-get install bubblewrap)."
    try:
        done = subprocess.run([binary, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                               "--proc", "/proc", "--dev", "/dev", "true"],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not run: {exc}"
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None
