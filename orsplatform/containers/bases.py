"""Base images the registry cannot provide here, built once per machine and substituted by name.

Authors' Dockerfiles start ``FROM python:3.11-slim`` or ``FROM ghcr.io/meta-pytorch/openenv-base``
(OpenEnv's, with ``uv``). Where no registry can be pulled from, the platform makes stand-ins: a
Debian bookworm root file system from ``debootstrap`` (bin/local-base, shared with the stack test),
cached under ORS_CONTAINERS_DIR as a tar named by the content of its recipe, imported into the
engine and tagged with the names it stands in for; openenv-base's stand-in adds ``uv`` (installed
from PyPI through the registry proxy, like any build). An engine that already holds an image of that
name (an operator's, pulled from a registry) keeps it: ``ORS_CONTAINER_LOCAL_BASES=false`` turns the
stand-ins off altogether.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from orsplatform.containers.engine import Engine

LOCAL_BASE_SCRIPT = Path(__file__).resolve().parents[2] / "bin" / "local-base"
EXTRA_PACKAGES = "curl"
# What the debootstrapped Python stands in for: the layout python:3.11-slim's Dockerfiles expect
# (pip installs allowed system-wide, `python` and /usr/local/bin/python, unbuffered output).
PYTHON_CHANGES = [
    "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1 UV_PYTHON_DOWNLOADS=never "
    "UV_LINK_MODE=copy SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "
    "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
    'CMD ["python3"]',
]
PYTHON_NAMES = ("python:3.11-slim", "python:3.11", "python:3.11-slim-bookworm", "python:3.11-bookworm")
OPENENV_BASE_NAMES = ("ghcr.io/meta-pytorch/openenv-base:latest", "openenv-base:latest", "envtorch-base:latest")
OPENENV_BASE_DOCKERFILE = """\
FROM {python}
RUN ln -sf /usr/bin/python3 /usr/local/bin/python && ln -sf /usr/bin/python3 /usr/local/bin/python3 \\
 && pip install --no-cache-dir uv==0.5.27 "fastapi>=0.104" "uvicorn>=0.24" "pydantic>=2"
WORKDIR /app
ENV PYTHONPATH=/app/src PYTHONUNBUFFERED=1 UV_SYSTEM_PYTHON=1
EXPOSE 8000
"""


def rootfs_key() -> str:
    digest = hashlib.sha256(LOCAL_BASE_SCRIPT.read_bytes())
    digest.update(EXTRA_PACKAGES.encode())
    return digest.hexdigest()[:16]


def recipe_key() -> str:
    digest = hashlib.sha256(rootfs_key().encode())
    digest.update("\n".join(PYTHON_CHANGES).encode())
    digest.update(OPENENV_BASE_DOCKERFILE.encode())
    return digest.hexdigest()[:16]


def enabled() -> bool:
    return os.environ.get("ORS_CONTAINER_LOCAL_BASES", "true").strip().lower() not in ("0", "false", "no")


def _has(engine: Engine, name: str) -> bool:
    return engine.run("image", "inspect", "--format", "{{.Id}}", name, check=False, timeout=30).returncode == 0


def ensure(engine: Engine, log: Callable[[str], None], build: Callable[[Path, str, Callable[[str], None]], None]
           ) -> None:
    """The stand-ins in ``engine``, made if missing. ``build(context, tag, log)`` builds a
    Dockerfile through the build service (openenv-base's stand-in installs uv from PyPI)."""
    if not enabled():
        return
    engine.state.mkdir(parents=True, exist_ok=True)
    # One process makes them; the others (parallel test processes, a second build) wait and find them.
    with open(engine.state / "bases.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _ensure(engine, log, build)


def _ensure(engine: Engine, log: Callable[[str], None], build: Callable[[Path, str, Callable[[str], None]], None]
            ) -> None:
    key = recipe_key()
    python = f"ors-local/python:3.11-{key}"
    openenv = f"ors-local/openenv-base:{key}"
    if not _has(engine, python):
        tar = _rootfs(engine.state / "bases", rootfs_key(), log)
        log(f"[platform] importing the local Python base {python}")
        args = ["import"]
        for change in PYTHON_CHANGES:
            args += ["--change", change]
        engine.run(*args, str(tar), python, timeout=600)
    if not _has(engine, openenv):
        with tempfile.TemporaryDirectory(prefix="ors-base-") as tmp:
            Path(tmp, "Dockerfile").write_text(OPENENV_BASE_DOCKERFILE.format(python=python))
            log(f"[platform] building the local openenv-base stand-in {openenv}")
            build(Path(tmp), openenv, log)
    for name in PYTHON_NAMES:
        _tag(engine, python, name)
    for name in OPENENV_BASE_NAMES:
        _tag(engine, openenv, name)


def _tag(engine: Engine, source: str, name: str) -> None:
    """``name`` for ``source``, unless the engine holds a real image of that name (a registry's)."""
    current = engine.run("image", "inspect", "--format", "{{.Id}}", name, check=False, timeout=30)
    wanted = engine.run("image", "inspect", "--format", "{{.Id}}", source, timeout=30).stdout.strip()
    labels = engine.run("image", "inspect", "--format", "{{index .Config.Labels \"ors.local-base\"}}", name,
                        check=False, timeout=30)
    if current.returncode == 0 and current.stdout.strip() != wanted and b"true" not in labels.stdout:
        # Another image of that name, not one of ours: an operator's real base wins.
        if not source.startswith("ors-local/python") or name not in PYTHON_NAMES:
            return
    engine.run("tag", source, name, timeout=30)


def _rootfs(folder: Path, key: str, log: Callable[[str], None]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tar = folder / f"bookworm-{key}.tar"
    if tar.exists():
        return tar
    log("[platform] building a Debian bookworm base with debootstrap (once per machine, a few minutes)")
    result = subprocess.run([str(LOCAL_BASE_SCRIPT), str(tar), EXTRA_PACKAGES], capture_output=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError("debootstrap failed: " + result.stderr.decode(errors="replace")[-2000:])
    return tar
