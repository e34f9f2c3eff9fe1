"""The build service: a version's Dockerfile built into its image by BuildKit, in the platform's
engine, whose only network is the package registries' proxy.

The Dockerfile is found where authors put it (the package root, or ``server/Dockerfile`` in
OpenEnv's layout) and built with the package as its context, as ``openenv build`` does (a
Dockerfile written for OpenEnv's repository root, ``COPY envs/<name>/ …``, gets that layout). A
``# syntax=`` line is dropped (it would pull a frontend image; the engine's built-in frontend
reads ``RUN --mount=type=cache`` and the rest of what OpenEnv's Dockerfiles use). ``RUN`` steps
run in the engine's network namespace (engine.py): a loopback and, for the length of the build, a
relay (relay.py) to the registry proxy (sandbox/registry_proxy.py), given to the build as its HTTP
proxy. What the proxy refuses is written to the build's log. The build has a wall-clock limit,
and memory, process and disk limits (build_limits.py); its output streams into the version's
build log line by line.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orsplatform.containers.build_limits import BuildLimits, Turn, turn
from orsplatform.containers.engine import Engine

RELAY = Path(__file__).with_name("relay.py")
DOCKERFILES = ("Dockerfile", "server/Dockerfile")
SYNTAX = re.compile(r"^\s*#\s*syntax\s*=", re.IGNORECASE)
LOG_LINE_CHARS = 2000
WATCH_SECONDS = 0.5


class BuildFailed(Exception):
    pass


@dataclass(frozen=True)
class Proxy:
    hosts: set[str]  # HTTPS (CONNECT, port 443)
    http_origins: frozenset[tuple[str, int]]  # plain HTTP (Debian's mirrors)
    index_tls: frozenset[tuple[str, int]] = frozenset()


def dockerfile_of(package_dir: Path) -> Path | None:
    for name in DOCKERFILES:
        path = package_dir / name
        if path.is_file() and not path.is_symlink():
            return path
    return None


def _openenv_name(package_dir: Path) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in (package_dir / "openenv.yaml").read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "name":
                name = value.strip().strip("'\"")
                return name if re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name) else None
    return None


def _context(package_dir: Path, dockerfile_text: str, tmp: Path) -> Path:
    """The package as the build context, or, for a Dockerfile written against OpenEnv's repository
    root (``COPY envs/<name>/``), that layout with the package at ``envs/<name>``."""
    name = _openenv_name(package_dir) or package_dir.name
    if re.search(rf"(^|\s)\.?/?envs/{re.escape(name)}(/|\s)", dockerfile_text, re.MULTILINE):
        root = tmp / "context"
        shutil.copytree(package_dir, root / "envs" / name, symlinks=True)
        return root
    return package_dir


def _dockerfile(source: Path, tmp: Path, log: Callable[[str], None]) -> tuple[Path, str]:
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    kept = []
    for number, line in enumerate(lines):
        if number < 5 and SYNTAX.match(line):
            log(f"[platform] ignoring {line.strip()!r}: the engine's built-in Dockerfile frontend is used")
            continue
        kept.append(line)
    text = "\n".join(kept) + "\n"
    path = tmp / "Dockerfile"
    path.write_text(text, encoding="utf-8")
    return path, text


@contextlib.contextmanager
def _relay(engine: Engine, proxy: Proxy, work: Path, log: Callable[[str], None]):
    """The registry proxy for this build, reachable from its RUN steps as http://127.0.0.1:PORT."""
    from orsplatform.sandbox.registry_proxy import RegistryProxy

    socket_path = work / "registry.sock"
    with RegistryProxy(socket_path, proxy.hosts, log, tls_origins=proxy.index_tls,
                       http_origins=proxy.http_origins):
        prefix = ["nsenter", f"--net=/run/netns/{engine.netns}"] if engine.netns else []
        relay = subprocess.Popen([*prefix, sys.executable, "-I", str(RELAY), str(socket_path)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert relay.stdout is not None
            port = int(relay.stdout.readline().strip() or 0)
            if not port:
                raise BuildFailed("The build's registry relay did not start.")
            yield f"http://127.0.0.1:{port}"
        finally:
            with contextlib.suppress(Exception):
                relay.stdin.close()  # type: ignore[union-attr]
            try:
                relay.wait(5)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()


def build(*, engine: Engine, context_dir: Path, dockerfile: Path | None, tag: str, proxy: Proxy,
          log: Callable[[str], None], timeout: float, extra_args: list[str] | None = None,
          limits: BuildLimits | None = None) -> str:
    """Build ``dockerfile`` (default: the package's) with ``context_dir``; the image's id. Within
    ``limits`` (default: the operator's ORS_IMAGE_BUILD_* settings), taking turns on the engine."""
    source = dockerfile or dockerfile_of(context_dir)
    if source is None:
        raise BuildFailed("The package has no Dockerfile (at its root or server/Dockerfile).")
    with tempfile.TemporaryDirectory(prefix="ors-image-") as tmp_name, \
            turn(engine, limits or BuildLimits.from_environment(), log) as this_turn:
        tmp = Path(tmp_name)
        path, text = _dockerfile(source, tmp, log)
        context = _context(context_dir, text, tmp)
        with _relay(engine, proxy, tmp, log) as proxy_url:
            args = ["build", "--network", "host", "--progress", "plain", "-t", tag, "-f", str(path),
                    "--label", "ors.image=true"]
            for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
                args += ["--build-arg", f"{name}={proxy_url}"]
            args += ["--build-arg", "no_proxy=localhost,127.0.0.1", "--build-arg", "NO_PROXY=localhost,127.0.0.1"]
            _stream(engine, [*args, *(extra_args or []), str(context)], log, timeout, this_turn)
    image = engine.run("image", "inspect", "--format", "{{.Id}}", tag, timeout=30).stdout.decode().strip()
    if not image:
        raise BuildFailed("The build ended without an image.")
    return image


def _stream(engine: Engine, args: list[str], log: Callable[[str], None], timeout: float, this_turn: Turn) -> None:
    proc = subprocess.Popen(engine.argv(*args), env=engine.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    started = time.monotonic()
    stopped: list[str] = []  # why the watchdog stopped the build
    done = threading.Event()

    def watchdog() -> None:
        while not done.wait(WATCH_SECONDS):
            if time.monotonic() - started > timeout:
                stopped.append(f"The image build took longer than {timeout:g} s and was stopped.")
            elif this_turn.over_disk():
                stopped.append(f"The image build wrote more than its {this_turn.limits.disk_mb} MB of disk "
                               "(ORS_IMAGE_BUILD_DISK_MB) and was stopped.")
            if stopped:
                proc.kill()  # the client's end of the session: BuildKit cancels the build
                return

    watcher = threading.Thread(target=watchdog, name="image-build-watchdog", daemon=True)
    watcher.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()[:LOG_LINE_CHARS]
            log(line)
            tail = (tail + [line])[-8:]
        status = proc.wait()
    finally:
        done.set()
        watcher.join()
    if stopped:
        raise BuildFailed(stopped[0])
    if status != 0:
        limit = this_turn.why_failed("\n".join(tail))
        raise BuildFailed(limit or "The image build failed: " + " | ".join(t for t in tail if t)[-1500:])
    log(f"[platform] image built in {time.monotonic() - started:.1f} s")
