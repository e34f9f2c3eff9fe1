"""Render one task's prompt in a separate process, without setup():

    python -m orsplatform.runners.prompt_render PACKAGE_DIR ENTRYPOINT SPEC_JSON OUT_JSON

Writes {"ok": true, "blocks": [...]} (the blocks as served on the wire) or {"ok": false, "error": ...}
to OUT_JSON. Imports no Django, like the publishing inspector: tenant code never runs beside the
platform's settings or database connections, and the limits below apply before it is imported.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import resource
import sys
from pathlib import Path


def _limits() -> None:
    memory = int(os.environ.get("ORS_INSPECT_MEMORY_BYTES", "0") or 0)
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    fsize = int(os.environ.get("ORS_INSPECT_FILE_BYTES", "0") or 0)
    if fsize > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def _maybe(value):
    return await value if inspect.isawaitable(value) else value


async def render(package_dir: str, entrypoint: str, spec) -> list:
    from pydantic import BaseModel

    from orsplatform.runners.loader import load_environment_class

    cls = load_environment_class(package_dir, entrypoint)
    env = cls(task_spec=spec, secrets={})
    blocks = await _maybe(env.get_prompt())  # no setup(): only tasks that render without it
    return [b.model_dump(mode="json") if isinstance(b, BaseModel) else b for b in blocks or []]


def main() -> int:
    package_dir, entrypoint, spec_path, out_path = sys.argv[1:5]
    _limits()
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = {"ok": True, "blocks": asyncio.run(render(package_dir, entrypoint, spec))}
    except BaseException as exc:  # tenant code may raise anything, SystemExit included
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    Path(out_path).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
