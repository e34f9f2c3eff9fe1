"""Writes of the environment pages: rendering a task's prompt on demand (the result is cached, the
only state it leaves)."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from django.core.cache import cache

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.runners.inspection import run_child

PROMPT_TIMEOUT_SECONDS = 20.0
MAX_PROMPT_BYTES = 2 * 1024 * 1024


def prompt_cache_key(*, version: EnvironmentVersion, spec: Any) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()
    return f"hub:prompt:{version.content_hash}:{digest}"


def task_prompt_cached(*, version: EnvironmentVersion, spec: Any) -> dict | None:
    return cache.get(prompt_cache_key(version=version, spec=spec))


def task_prompt_render(*, version: EnvironmentVersion, spec: Any) -> dict:
    """The task's prompt as a session would be served it, for tasks whose get_prompt() needs no
    setup(): {"ok": True, "blocks": [...]} or {"ok": False, "error": "..."}. Runs the environment's
    code as the publishing inspector runs (runners/inspection.py: the workers' sandbox, its limits,
    its process group killed at the end) and caches the answer by content hash and task, since a
    version never changes."""
    key = prompt_cache_key(version=version, spec=spec)
    cached = cache.get(key)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="orsprompt-") as tmp:
        work = Path(tmp)
        (work / "spec.json").write_text(json.dumps(spec))
        run = run_child(module="prompt_render", package_dir=Path(version.package_path), work=work,
                        args=[version.entrypoint, "{work}/spec.json", "{work}/out.json"],
                        timeout=PROMPT_TIMEOUT_SECONDS)
        out = work / "out.json"
        if not run.exited:
            result = {"ok": False, "error": f"get_prompt() did not answer within {PROMPT_TIMEOUT_SECONDS:g} s."}
        elif not out.is_file() or out.stat().st_size > MAX_PROMPT_BYTES:
            result = {"ok": False, "error": "The prompt could not be rendered (the process ended without one, "
                                            "or it was larger than 2 MiB)."}
        else:
            result = json.loads(out.read_text())
    result["rendered_at"] = time.time()
    cache.set(key, result, None)
    return result
