"""Writes of the environment pages: rendering a task's prompt on demand (the result is cached, the
only state it leaves)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from django.core.cache import cache

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.executors.inspection import Results, run_child

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
    code as the publishing inspector runs (executors/inspection.py: the workers' sandbox, its limits,
    its process group killed at the end) and caches the answer by content hash and task, since a
    version never changes."""
    key = prompt_cache_key(version=version, spec=spec)
    cached = cache.get(key)
    if cached is not None:
        return cached
    # The spec goes in on the child's stdin and the answer comes back on its stdout: nothing of
    # the host is writable from it, and nothing it could have written is opened here.
    results = Results(max_bytes=MAX_PROMPT_BYTES)
    run = run_child(module="prompt_render", package_dir=Path(version.package_path), args=[version.entrypoint],
                    feed=json.dumps(spec).encode(), timeout=PROMPT_TIMEOUT_SECONDS, results=results)
    answer = results.report()
    if run.refused:
        result = {"ok": False, "error": "The prompt could not be rendered (it was larger than 2 MiB, or the "
                                        "process handed back something else)."}
    elif not run.exited:
        result = {"ok": False, "error": f"get_prompt() did not answer within {PROMPT_TIMEOUT_SECONDS:g} s."}
    elif not _answer_valid(answer):
        result = {"ok": False, "error": "The prompt could not be rendered (the process ended without one)."}
    else:
        result = {"ok": True, "blocks": answer["blocks"]} if answer["ok"] else {"ok": False,
                                                                               "error": answer["error"][:2000]}
    result["rendered_at"] = time.time()
    cache.set(key, result, None)
    return result


def _answer_valid(answer: Any) -> bool:
    """The child's answer has the shape the page renders (tenant code could have written any)."""
    if not isinstance(answer, dict) or answer.get("ok") not in (True, False):
        return False
    if answer["ok"]:
        blocks = answer.get("blocks")
        return isinstance(blocks, list) and all(isinstance(b, dict) for b in blocks)
    return isinstance(answer.get("error"), str)
