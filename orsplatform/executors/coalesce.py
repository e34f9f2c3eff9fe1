"""Redis commands of many concurrent callers in one pipeline, for the celery executor's two sides
(a gateway's requests, a runner node's replies).

A caller adds its commands to the next pipeline and (optionally) awaits its own replies. One
pipeline is in flight at a time: what is queued while it travels goes out in the next one, so at
load many episodes share a round trip, and a lone caller waits no longer than it did with a
pipeline of its own. Commands keep their order, within a caller and across callers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

log = logging.getLogger(__name__)

Build = Callable[[Pipeline], Any]  # adds a caller's commands to the pipeline


class Coalescer:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        # (build, how many commands it added, the caller's future or None when nobody waits)
        self._pending: list[tuple[Build, asyncio.Future | None]] = []
        self._task: asyncio.Task | None = None

    async def run(self, build: Build) -> list[Any]:
        """The replies to the commands `build` adds, in order; raises what the round trip raised."""
        future = asyncio.get_running_loop().create_future()
        self._add(build, future)
        return await future

    def push(self, build: Build) -> None:
        """Commands nobody waits for (a failed round trip is logged)."""
        self._add(build, None)

    async def flush(self) -> None:
        """Wait until everything added so far has been sent."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def _add(self, build: Build, future: asyncio.Future | None) -> None:
        self._pending.append((build, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._send(batch)
        finally:
            self._task = None

    async def _send(self, batch: list[tuple[Build, asyncio.Future | None]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        spans = []
        kept = []
        for build, future in batch:
            start = len(pipe.command_stack)
            try:
                build(pipe)
            except Exception as exc:  # a caller's own mistake: its caller hears of it, not the rest
                del pipe.command_stack[start:]
                if future is None:
                    log.exception("could not build Redis commands")
                elif not future.done():
                    future.set_exception(exc)
                continue
            kept.append((build, future))
            spans.append((start, len(pipe.command_stack)))
        batch = kept
        if not batch:
            return
        try:
            # A command's error is its caller's alone (returned in place); a lost connection is everyone's.
            replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            waiting = [future for _, future in batch if future is not None]
            if len(waiting) < len(batch):  # nobody will see it otherwise
                log.warning("could not send %d Redis commands: %s", spans[-1][1], exc)
            for future in waiting:
                if not future.done():  # its caller may have been cancelled meanwhile
                    future.set_exception(exc)
            return
        for (_, future), (start, end) in zip(batch, spans, strict=True):
            mine = replies[start:end]
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if future is None:
                if error is not None:
                    log.warning("a Redis command failed: %s", error)
            elif not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(mine)
