"""Shared helpers for the ORS endpoint tests: a private "probe" environment of team acme whose
behaviour (slow or failing setup, slow, blocking, raising or huge tools) is chosen per task_spec,
and small polling / database helpers (tests wait on conditions with a deadline, never on a fixed
sleep)."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

PROBE_SLUG = "probe"
PROBE = f"acme/{PROBE_SLUG}"

PROBE_ENV = textwrap.dedent('''
    """A test-only environment; what it does is chosen by the task_spec."""

    import asyncio
    import time
    from pathlib import Path

    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class NapParams(BaseModel):
        seconds: float


    class BlockParams(BaseModel):
        seconds: float
        marker: str


    class BigParams(BaseModel):
        size: int


    class CountParams(BaseModel):
        n: int


    class Probe(Environment):
        def __init__(self, task_spec=None, secrets=None):
            super().__init__(task_spec or {}, secrets or {})
            self._secrets = dict(secrets or {})
            self.inflight = 0
            self.max_inflight = 0

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train"), Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            if split not in ("train", "test"):
                raise ValueError(split)
            return [{"id": f"{split}-{i}", "question": f"probe question {split} {i}"} for i in range(5)]

        async def setup(self):
            if self.task_spec.get("setup_fail"):
                raise RuntimeError("probe setup exploded")
            if self.task_spec.get("setup_sleep"):
                await asyncio.sleep(float(self.task_spec["setup_sleep"]))

        def get_prompt(self):
            return [TextBlock(text=str(self.task_spec.get("question", "probe")))]

        @tool
        async def nap(self, params: NapParams) -> ToolOutput:
            """Sleep on the event loop; reports the most calls of this instance ever in flight."""
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await asyncio.sleep(params.seconds)
            finally:
                self.inflight -= 1
            return ToolOutput(blocks=[TextBlock(text="rested")], metadata={"max_inflight": self.max_inflight},
                              reward=0.0, finished=False)

        @tool
        def block(self, params: BlockParams) -> ToolOutput:
            """A sync tool that blocks its thread."""
            Path(params.marker).write_text("started")
            time.sleep(params.seconds)
            return ToolOutput(blocks=[TextBlock(text="unblocked")], reward=0.0, finished=False)

        @tool
        def boom(self) -> ToolOutput:
            """Tool code that raises."""
            raise RuntimeError("kaboom from tool code")

        @tool
        def big(self, params: BigParams) -> ToolOutput:
            """A result far larger than one SSE chunk."""
            text = "".join(chr(ord("a") + i % 26) for i in range(params.size))
            return ToolOutput(blocks=[TextBlock(text=text)], metadata={"size": params.size},
                              reward=0.25, finished=False)

        @tool
        def count(self, params: CountParams) -> ToolOutput:
            """Needs an integer."""
            return ToolOutput(blocks=[TextBlock(text=str(params.n * 2))], reward=0.5, finished=False)

        @tool
        def secrets_seen(self) -> ToolOutput:
            """Names (never values) of the secrets this instance got."""
            return ToolOutput(blocks=[TextBlock(text="ok")], metadata={"names": sorted(self._secrets)},
                              reward=0.0, finished=False)

        @tool
        def finish(self) -> ToolOutput:
            """Ends the episode."""
            return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0, finished=True)
''')

PROBE_MANIFEST = textwrap.dedent(f'''
    name = "{PROBE_SLUG}"
    description = "Test-only probe environment."
    entrypoint = "env:Probe"
    visibility = "private"
    tool_timeout_seconds = 30
    required_secrets = []
''')


def publish_probe_sync(team, tmp_path: Path) -> None:
    from orsplatform.catalog.services import environment_publish

    src = tmp_path / "probe_pkg"
    src.mkdir(parents=True, exist_ok=True)
    (src / "env.py").write_text(PROBE_ENV)
    (src / "manifest.toml").write_text(PROBE_MANIFEST)
    environment_publish(team=team, source_dir=src, visibility="private")



async def wait_for(predicate: Callable[[], Awaitable[Any] | Any], timeout: float = 10.0,
                   what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)  # polling interval while waiting on the condition


def session_row(sid: str) -> dict | None:
    from orsplatform.episodes.models import Session

    return Session.objects.filter(sid=sid).values().first()


def tool_call_rows(sid: str | None = None) -> list[dict]:
    from orsplatform.episodes.models import ToolCall

    qs = ToolCall.objects.all() if sid is None else ToolCall.objects.filter(session__sid=sid)
    return list(qs.order_by("id").values())


def session_count(**filters: Any) -> int:
    from orsplatform.episodes.models import Session

    return Session.objects.filter(**filters).count()


async def arow(sid: str) -> dict | None:
    return await sync_to_async(session_row)(sid)


async def acalls(sid: str | None = None) -> list[dict]:
    return await sync_to_async(tool_call_rows)(sid)


async def acount(**filters: Any) -> int:
    return await sync_to_async(session_count)(**filters)


def all_rows_dump() -> str:
    """Every Session and ToolCall row, every column, as one string (for leak searches)."""
    from orsplatform.episodes.models import Session, ToolCall

    rows = list(Session.objects.values()) + list(ToolCall.objects.values())
    return json.dumps(rows, default=str)


def sid_headers(person, sid: str) -> dict[str, str]:
    return {**person.headers, "X-Session-ID": sid}
