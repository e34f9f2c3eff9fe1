"""A container's limits: the package's ``[sandbox]`` requests (manifest.toml, as for Python
environments) within the operator's container maxima. Environment variables, read the same way on
gateways and runner nodes (orsplatform/config.py documents them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orsplatform.sandbox.config import Limits, read_manifest_sandbox

MiB = 1024 * 1024
DEFAULTS = {"ORS_CONTAINER_MEMORY_MB": 2048, "ORS_CONTAINER_MAX_MEMORY_MB": 8192, "ORS_CONTAINER_PROCESSES": 512,
            "ORS_CONTAINER_MAX_PROCESSES": 4096, "ORS_CONTAINER_CPUS": 2.0, "ORS_CONTAINER_MAX_CPUS": 4.0,
            "ORS_CONTAINER_OPEN_FILES": 4096}


def setting(name: str) -> float:
    raw = os.environ.get(name, "").strip()
    default = DEFAULTS[name]
    try:
        return type(default)(raw) if raw else default
    except ValueError:
        return default


@dataclass(frozen=True)
class ContainerLimits:
    limits: Limits
    cpus: float


def container_limits(package_dir: str) -> ContainerLimits:
    wanted = read_manifest_sandbox(package_dir)

    def pick(key: str, default: float, maximum: float) -> float:
        value = wanted.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            return default
        return min(value, maximum)

    memory = int(pick("memory_mb", setting("ORS_CONTAINER_MEMORY_MB"), setting("ORS_CONTAINER_MAX_MEMORY_MB")))
    processes = int(pick("processes", setting("ORS_CONTAINER_PROCESSES"), setting("ORS_CONTAINER_MAX_PROCESSES")))
    cpus = float(pick("cpus", setting("ORS_CONTAINER_CPUS"), setting("ORS_CONTAINER_MAX_CPUS")))
    files = int(setting("ORS_CONTAINER_OPEN_FILES"))
    return ContainerLimits(Limits(memory_bytes=memory * MiB, cpu_seconds=0, processes=processes, open_files=files,
                                  tmp_bytes=memory * MiB), cpus=cpus)
