"""Render one task's prompt in a separate process, without setup():

    python -m orsplatform.sandbox.prompt_render PACKAGE_DIR ENTRYPOINT < SPEC_JSON

Answers on stdout with one record, ``R {"ok": true, "blocks": [...]}`` (the blocks as served on the
wire) or ``R {"ok": false, "error": ...}`` (executors/inspection.py reads it); what tenant code prints
to stdout goes to stderr. Imports no Django, like the publishing inspector: tenant code never runs
beside the platform's settings or database connections, and the limits below apply before it is
imported.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import resource
import sys

from orsplatform.sandbox import openenv_host


def _limit(kind: int, value: int) -> None:
    """Sets the limit, never above the one the sandbox already imposes (which may be lower)."""
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _limits() -> None:
    memory = int(os.environ.get("ORS_INSPECT_MEMORY_BYTES", "0") or 0)
    if memory > 0:
        _limit(resource.RLIMIT_AS, memory)
    fsize = int(os.environ.get("ORS_INSPECT_FILE_BYTES", "0") or 0)
    if fsize > 0:
        _limit(resource.RLIMIT_FSIZE, fsize)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def _maybe(value):
    return await value if inspect.isawaitable(value) else value


async def render(package_dir: str, entrypoint: str, spec) -> list:
    from pydantic import BaseModel

    from orsplatform.sandbox.loader import load_environment_class

    cls = load_environment_class(package_dir, entrypoint)
    if openenv_host.is_openenv_class(cls):  # an OpenEnv-SDK class: its reset observation is the prompt
        return await _openenv_prompt(package_dir, cls, spec)
    env = cls(task_spec=spec, secrets={})
    blocks = await _maybe(env.get_prompt())  # no setup(): only tasks that render without it
    return [b.model_dump(mode="json") if isinstance(b, BaseModel) else b for b in blocks or []]


async def _openenv_prompt(package_dir: str, cls: type, spec) -> list:
    from orsplatform.sandbox.loader import register_package

    async def run(fn, *args):
        return await asyncio.to_thread(fn, *args)

    declaration = openenv_host.declare(register_package(package_dir), package_dir, cls)
    episode = openenv_host.Episode(declaration, run)
    try:
        return [await episode.start(spec)]
    finally:
        await episode.stop()


def main() -> int:
    package_dir, entrypoint = sys.argv[1:3]
    # The result pipe on a descriptor of its own (not inherited by what tenant code starts);
    # stdout, where tenant code prints, now goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    spec = json.loads(sys.stdin.buffer.read())
    _limits()
    openenv_host.NoWebInterface.install()  # as in the worker: OpenEnv's /web page is not served
    try:
        result = {"ok": True, "blocks": asyncio.run(render(package_dir, entrypoint, spec))}
    except BaseException as exc:  # tenant code may raise anything, SystemExit included
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    out.write(b"R " + json.dumps(result, default=str).encode() + b"\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
