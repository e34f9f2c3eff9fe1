"""A container as a pool worker: one container serves the sessions of one (version, calling team)
pair, exactly as a sandbox worker does (sandbox/pool.py starts, places, retires and reports it).

The container runs the version's image under gVisor (the engine's ``ors-runsc`` runtime, whose
flags are runtime.py's: no network, the image's root behind an overlay in memory), with the
pair's memory, CPU, process and open-file limits, no capabilities beyond Docker's defaults, no
new privileges, and none of the platform's variables or secrets. Its process is the shim
(inside/shim.py, bound read-only at /.ors) speaking the worker protocol on stdio; the author's
server runs beside it on the container's own loopback. Killing the worker removes the container.

Secrets: the server gets those of the manifest's ``required_secrets`` the session sent, as
environment variables of its process, and no other. They go to the shim in the first frame on its
stdin (never as ``docker run -e``, which ``docker inspect`` shows, never on a disk), and the pool
keys the container by them (pool.py), so callers with other values get other containers. No
session's secrets go into a container in its setup frames.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import logging
import secrets
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orsplatform.containers import engine as engines
from orsplatform.containers.images import ImageRecord, archive_path, record_path, record_read
from orsplatform.containers.limits import container_limits
from orsplatform.containers.runtime import runtime_name
from orsplatform.sandbox.config import Limits
from orsplatform.sandbox.redact import redact, secret_values
from orsplatform.sandbox.supervised import HEADER, MAX_FRAME, Worker, WorkerGone

log = logging.getLogger("orsplatform.containers")
INSIDE = Path(__file__).with_name("inside")
SHIM = "/.ors/shim.py"
START_SECONDS = 120.0
HOST_TASKS_BASE, HOST_TASKS_PER_PROCESS = 128, 8  # a first start imports the author's server under gVisor

_engine: engines.Engine | None = None
_engine_lock = threading.Lock()


def shared_engine() -> engines.Engine:
    """This process's share of the engine, taken on first use and given back at exit."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = engines.acquire()
            atexit.register(engines.release, _engine)
        return _engine


def is_container(package_dir: str) -> bool:
    return record_path(package_dir).exists()


def worker_class(package_dir: str) -> type[Worker]:
    """The pool's choice of worker for a package: a container for a package built into an image."""
    return ContainerWorker if is_container(package_dir) else Worker


def run_argv(engine: engines.Engine, record: ImageRecord, limits: Limits, name: str, cpus: float,
             environ: bool = False) -> list[str]:
    # `environ`: the shim reads the server's secrets from its first frame before it starts it.
    spec = {"command": record.command, "port": record.port, "start_seconds": START_SECONDS, "environ": environ}
    memory = str(limits.memory_bytes)
    return engine.argv(
        "run", "--rm", "-i", "--name", name, "--runtime", runtime_name(), "--network", "none",
        "--memory", memory, "--memory-swap", memory, "--cpus", f"{cpus:g}",
        # The tenant's processes and threads: gVisor enforces RLIMIT_NPROC itself. The host's pids
        # limit is a backstop sized for gVisor's own threads (a sentry's few dozen, and ptrace's
        # stubs, several host tasks per tenant process).
        "--ulimit", f"nproc={limits.processes}:{limits.processes}",
        "--pids-limit", str(HOST_TASKS_BASE + HOST_TASKS_PER_PROCESS * limits.processes),
        "--ulimit", f"nofile={limits.open_files}:{limits.open_files}",
        "--security-opt", "no-new-privileges", "--label", "ors.container=true",
        "--log-driver", "none", "-v", f"{INSIDE}:/.ors:ro", "--entrypoint", "/usr/bin/env",
        record.image, "python3", SHIM, json.dumps(spec))


class ImageMissing(Exception):
    pass


_present: set[str] = set()  # images known to be in this process's engine


def ensure_image(engine: engines.Engine, record: ImageRecord, package_dir: str) -> None:
    """The version's image in this node's engine: there already (the engine that built it), or loaded
    from the archive the build left beside the package (a runner node with an engine of its own)."""
    if record.image in _present:
        return
    if engine.run("image", "inspect", "--format", "{{.Id}}", record.image, check=False, timeout=60).returncode != 0:
        archive = archive_path(package_dir)
        if not archive.is_file():
            raise ImageMissing("its image is not in this node's engine and no archive of it was kept "
                               "(ORS_CONTAINER_ARCHIVES)")
        loaded = engine.run("load", "-q", "-i", str(archive), check=False, timeout=1800)
        if loaded.returncode != 0:
            raise ImageMissing("loading its image failed: " + loaded.stderr.decode(errors="replace")[-300:])
        log.info("loaded image %s from its archive", record.image[:19])
    _present.add(record.image)


@functools.lru_cache(maxsize=512)
def _declared_secrets(package_dir: str) -> tuple[str, ...]:
    """The secret names a version's image record declares, read once per process: the record is
    written by the build and never changes, and this is asked at every session with secrets."""
    record = record_read(package_dir)
    return tuple(record.secrets) if record else ()


class ContainerWorker(Worker):
    name: str = ""

    @classmethod
    def start_secrets(cls, package_dir: str, secrets: Mapping[str, str]) -> dict[str, str]:
        """The session's secrets its manifest declares (required_secrets): the server's environment."""
        return {name: secrets[name] for name in _declared_secrets(package_dir) if name in secrets}

    async def request(self, op: str, timeout: float | None = None, lazy: bool = False, **fields: Any) -> Any:
        # The shim has no use for a session's secrets: they stay out of the tenant's sandbox.
        fields.pop("secrets", None)
        return await super().request(op, timeout, lazy, **fields)

    async def spawn(self, package_dir: str, limits: Limits) -> None:
        sized = container_limits(package_dir)  # the container's own defaults and maxima, not a worker's
        self._limits = limits = sized.limits
        record = record_read(package_dir)
        if record is None:
            raise WorkerGone(f"The environment {self.label} has no image (its build did not finish).")
        try:
            engine = await asyncio.to_thread(shared_engine)
        except engines.EngineUnavailable as exc:
            raise WorkerGone(f"The environment {self.label} is a container and containers cannot run here: "
                             f"{exc}") from None
        try:
            await asyncio.to_thread(ensure_image, engine, record, package_dir)
        except ImageMissing as exc:
            raise WorkerGone(f"The environment {self.label} cannot start on this node: {exc}") from None
        self.name = f"ors-{secrets.token_hex(8)}"
        argv = run_argv(engine, record, limits, self.name, sized.cpus, environ=bool(self.environ))
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=MAX_FRAME, env=engine.env(), start_new_session=True, close_fds=True)
        if self.environ:
            body = json.dumps({"environ": self.environ}).encode()
            self.proc.stdin.write(HEADER.pack(len(body)) + body)  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._reader = asyncio.create_task(self._read())
        asyncio.create_task(self._drain_stderr())
        try:
            async with asyncio.timeout(max(self.config.start_seconds, START_SECONDS)):
                await asyncio.shield(self._ready)
        except (TimeoutError, WorkerGone) as exc:
            self.kill("it did not start in time" if isinstance(exc, TimeoutError) else None)
            # What the server printed: it may hold the secrets it was started with.
            detail = redact("; ".join(self._stderr)[-2000:], secret_values(self.environ))
            raise WorkerGone(f"The container for environment {self.label} could not start"
                             f"{': ' + detail if detail else ''}.") from None

    def kill(self, reason: str | None = None, fault: bool = False) -> None:
        running = self.proc is not None and self.proc.returncode is None
        super().kill(reason, fault)
        if self.name and (running or self.kill_reason):
            name, self.name = self.name, ""
            # The CLI's death leaves the container running: it is removed by name, off the loop.
            threading.Thread(target=_remove, args=(name,), daemon=True).start()

    def end_strays(self) -> None:
        """Nothing to do from outside: the container's processes are the author's server's."""


def _remove(name: str) -> None:
    try:
        engine = shared_engine()
        engine.run("rm", "-f", name, timeout=60, check=False)
    except (engines.EngineUnavailable, subprocess.TimeoutExpired, OSError):
        log.warning("could not remove container %s", name)
