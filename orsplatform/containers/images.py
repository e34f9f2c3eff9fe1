"""What a stored package's image is: a record beside the package (``<package>.image``, as
``<package>.runtime`` names a Python environment), read by the pool to start containers.

Django-free: the pool reads it on gateways and runner nodes alike.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

SUFFIX = ".image"


@dataclass(frozen=True)
class ImageRecord:
    image: str  # the image's id (sha256:…), content-addressed
    tag: str  # its name in the engine (ors-env/<content hash>)
    command: list[str]  # the image's own ENTRYPOINT + CMD: what the author ships, started as is
    port: int = 8000
    layers: list[dict] = field(default_factory=list)  # [{"id", "size", "created_by"}], newest first
    size: int = 0
    # The manifest's required_secrets: the names of a session's secrets the image's server gets as
    # environment variables (worker.py; the values never touch the record, the engine or a disk).
    secrets: list[str] = field(default_factory=list)


def record_path(package_dir: str | Path) -> Path:
    return Path(str(package_dir).rstrip("/") + SUFFIX)


def archive_path(package_dir: str | Path) -> Path:
    """The image as ``docker save`` writes it, beside the package: how runner nodes, each with an engine
    of its own and the packages' folder shared read-only, get an image without a registry."""
    return Path(str(package_dir).rstrip("/") + SUFFIX + ".tar")


def record_write(package_dir: str | Path, record: ImageRecord | None) -> None:
    path = record_path(package_dir)
    if record is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(path)


def record_read(package_dir: str | Path) -> ImageRecord | None:
    try:
        data = json.loads(record_path(package_dir).read_text())
    except (OSError, ValueError):
        return None
    try:
        return ImageRecord(image=str(data["image"]), tag=str(data["tag"]), command=[str(a) for a in data["command"]],
                           port=int(data.get("port") or 8000), layers=list(data.get("layers") or []),
                           size=int(data.get("size") or 0), secrets=[str(n) for n in data.get("secrets") or []])
    except (KeyError, TypeError, ValueError):
        return None


PORT_FLAG = re.compile(r"--port[= ](\d{2,5})\b")


def server_port(command: list[str], env: list[str], openenv_port: int | None) -> int:
    """Where the image's server listens: its command's ``--port``, else ``PORT`` in its environment,
    else openenv.yaml's ``port``, else OpenEnv's 8000."""
    match = PORT_FLAG.search(" ".join(shlex.quote(a) if " " not in a else a for a in command))
    if match:
        return int(match.group(1))
    for entry in env:
        name, _, value = entry.partition("=")
        if name == "PORT" and value.isdigit():
            return int(value)
    return openenv_port or 8000
