"""The Docker engine container environments are built and run on.

An operator's own engine (``ORS_DOCKER_HOST``) is used as it is, with ``ors-runsc`` registered as a
runtime (docs/containers.md says how). Otherwise the platform starts its own, as bin/stack-test
does: ``dockerd --iptables=false --bridge=none`` (no change to the machine's networking), data and
socket under ``ORS_CONTAINERS_DIR``, runsc registered through its daemon config, and started
inside a network namespace of its own with only a loopback: what a build's ``RUN`` step can reach
is that loopback, where each build's relay (relay.py) leads to the registry proxy and nowhere else.

Several processes share one engine (the gateway, a Celery worker, parallel test processes): each
holds a shared lock on ``engine.lock`` while it uses it; whoever starts it stops it only when no one
else holds that lock (``release``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from orsplatform.containers.runtime import daemon_runtimes, runsc_path, runtime_name

START_SECONDS = 60.0


class EngineUnavailable(Exception):
    """Containers cannot run here; str(exc) says why."""


def docker_cli() -> str | None:
    # Debian's CLI beside its engine first: a newer CLI elsewhere on the PATH may want buildx.
    for candidate in (os.environ.get("ORS_DOCKER_CLI"), "/usr/bin/docker", shutil.which("docker")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def dockerd_path() -> str | None:
    return shutil.which("dockerd") or ("/usr/sbin/dockerd" if os.path.exists("/usr/sbin/dockerd") else None)


@dataclass
class Engine:
    host: str  # unix:///path/docker.sock
    state: Path
    netns: str | None = None
    started: bool = False  # by this process
    _lock: int | None = field(default=None, repr=False)

    @property
    def cgroup_parent(self) -> str | None:
        """The cgroup the platform's own engine puts its containers and build steps under (named after
        the engine, so two engines on one machine never share one; build_limits.py limits its builds)."""
        return f"/{self.netns}" if self.netns else None

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "DOCKER_HOST": self.host,
                "DOCKER_BUILDKIT": "1", "HOME": str(self.state), "DOCKER_CONFIG": str(self.state / "cli")}

    def argv(self, *args: str) -> list[str]:
        cli = docker_cli()
        if cli is None:
            raise EngineUnavailable("The docker CLI is not installed (bin/system-deps containers).")
        return [cli, *args]

    def run(self, *args: str, timeout: float = 120, check: bool = True, input: bytes | None = None
            ) -> subprocess.CompletedProcess:
        result = subprocess.run(self.argv(*args), env=self.env(), capture_output=True, timeout=timeout, input=input)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, args, result.stdout, result.stderr)
        return result

    def answers(self) -> bool:
        try:
            return self.run("version", "--format", "{{.Server.Version}}", timeout=10, check=False).returncode == 0
        except (subprocess.TimeoutExpired, EngineUnavailable, OSError):
            return False

    def has_runtime(self) -> bool:
        result = self.run("info", "--format", "{{json .Runtimes}}", timeout=20, check=False)
        return result.returncode == 0 and runtime_name() in result.stdout.decode(errors="replace")


def containers_dir() -> Path:
    configured = os.environ.get("ORS_CONTAINERS_DIR")
    if configured:
        return Path(configured)
    try:
        from django.conf import settings

        if settings.configured and getattr(settings, "ORS_CONTAINERS_DIR", None):
            return Path(settings.ORS_CONTAINERS_DIR)
    except ImportError:
        pass
    return Path(__file__).resolve().parents[2] / "var" / "containers"


def problem() -> str | None:
    """Why the platform could not start an engine here (None: it can, or one is configured)."""
    if os.environ.get("ORS_DOCKER_HOST"):
        return None
    if docker_cli() is None or dockerd_path() is None:
        return "Docker is not installed (docker.io; `bin/system-deps containers` installs it)."
    if runsc_path() is None:
        return "gVisor's runsc is not installed (runsc; `bin/system-deps containers` installs it)."
    if os.geteuid() != 0:
        return "Starting a Docker engine needs root (or set ORS_DOCKER_HOST to an engine with ors-runsc)."
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (the build engine's network namespace needs it)."
    return None


def acquire(state: Path | None = None) -> Engine:
    """The engine, started if none answers; the caller holds a share of it until ``release``."""
    configured = os.environ.get("ORS_DOCKER_HOST")
    state = Path(state or containers_dir()).resolve()
    state.mkdir(parents=True, exist_ok=True)
    if configured:
        engine = Engine(host=configured, state=state)
        if not engine.answers():
            raise EngineUnavailable("The Docker engine at ORS_DOCKER_HOST does not answer.")
        return engine
    why = problem()
    if why is not None:
        raise EngineUnavailable(why)
    engine = Engine(host=f"unix://{state}/docker.sock", state=state, netns=_netns_name(state))
    with open(state / "start.lock", "w") as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)
        if not engine.answers():
            _start(engine)
        engine._lock = os.open(state / "engine.lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(engine._lock, fcntl.LOCK_SH)
    return engine


def release(engine: Engine) -> None:
    """Give up this process's share; the last one out stops an engine the platform started."""
    if engine._lock is None:
        return
    state = engine.state
    with open(state / "start.lock", "w") as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)
        fcntl.flock(engine._lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(engine._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(engine._lock)
            engine._lock = None
            return  # someone else still uses it
        _stop(engine)
        os.close(engine._lock)
        engine._lock = None


def _netns_name(state: Path) -> str:
    return "ors-engine-" + hashlib.sha256(str(state).encode()).hexdigest()[:10]


def _start(engine: Engine) -> None:
    state = engine.state
    config = state / "daemon.json"
    config.write_text(json.dumps({"runtimes": daemon_runtimes(), "features": {"buildkit": True},
                                  "cgroup-parent": engine.cgroup_parent}, indent=1))
    netns = engine.netns
    assert netns is not None
    subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True, capture_output=True)
    (state / "docker.sock").unlink(missing_ok=True)
    log = open(state / "dockerd.log", "ab")
    # Its own session: stopping the platform's process group never signals it mid-build, and
    # release() stops it on purpose.
    subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", dockerd_path() or "dockerd", "--config-file", str(config),
                      "--iptables=false", "--ip6tables=false", "--bridge=none", "--data-root", str(state / "data"),
                      "--exec-root", str(state / "exec"), "--pidfile", str(state / "dockerd.pid"),
                      "-H", engine.host], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                     close_fds=True)
    log.close()
    deadline = time.monotonic() + START_SECONDS
    while not engine.answers():
        if time.monotonic() > deadline:
            tail = (state / "dockerd.log").read_bytes()[-2000:].decode(errors="replace")
            raise EngineUnavailable(f"dockerd did not answer within {START_SECONDS:g} s: {tail}")
        time.sleep(0.2)
    engine.started = True


def _stop(engine: Engine) -> None:
    pidfile = engine.state / "dockerd.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired, EngineUnavailable):
            ids = engine.run("ps", "-aq", "--filter", "label=ors.container", timeout=30).stdout.split()
            if ids:
                engine.run("rm", "-f", *[i.decode() for i in ids], timeout=60, check=False)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if engine.netns:
        subprocess.run(["ip", "netns", "delete", engine.netns], capture_output=True)
    _remove_cgroups(engine)


def _remove_cgroups(engine: Engine) -> None:
    """The engine's cgroup parent in every hierarchy, once it stopped (a group still in use stays)."""
    parent = engine.cgroup_parent
    if parent is None:
        return
    roots = [Path("/sys/fs/cgroup")]
    with contextlib.suppress(OSError):
        roots += [p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir()]
    for root in roots:
        group = root / parent.strip("/")
        for path in (group / "buildkit", group):
            with contextlib.suppress(OSError):
                path.rmdir()
