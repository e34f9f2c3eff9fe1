"""Shared helpers for the ORS endpoint tests: a private "probe" environment of team acme whose
behaviour (slow or failing setup, slow, blocking, raising or huge tools) is chosen per task_spec,
and small polling / database helpers (tests wait on conditions with a deadline, never on a fixed
sleep)."""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

PROBE_SLUG = "probe"
PROBE = f"acme/{PROBE_SLUG}"

PROBE_ENV = textwrap.dedent('''
    """A test-only environment; what it does is chosen by the task_spec."""

    import asyncio
    import sys
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
            if self.task_spec.get("setup_fail_reveal"):
                raise RuntimeError(f"probe setup exploded with secrets {sorted(self._secrets.values())}")
            if self.task_spec.get("setup_fail"):
                raise RuntimeError("probe setup exploded")
            if self.task_spec.get("setup_sleep"):
                await asyncio.sleep(float(self.task_spec["setup_sleep"]))

        def get_prompt(self):
            if self.task_spec.get("prompt_exit"):
                import sys

                sys.exit(5)
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
            # Seen by the test in the supervisor's copy of the worker's stderr (the sandbox lets
            # the tool write nowhere the test could look).
            print(f"started {params.marker}", file=sys.stderr, flush=True)
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
        def mangled(self) -> ToolOutput:
            """Returns text that is not valid Unicode (a lone surrogate)."""
            return ToolOutput(blocks=[TextBlock(text="broken " + chr(0xD800) + " text")], reward=0.0,
                              finished=False)

        @tool
        def leave(self) -> ToolOutput:
            """Tool code that calls sys.exit()."""
            import sys

            sys.exit(3)

        @tool
        async def leave_async(self) -> ToolOutput:
            """Async tool code that raises SystemExit."""
            raise SystemExit(4)

        @tool
        def reveal(self) -> ToolOutput:
            """Tool code that echoes its secrets' values (environments should not, but may)."""
            values = sorted(self._secrets.values())
            return ToolOutput(blocks=[TextBlock(text=f"secrets: {values}")], metadata={"values": values},
                              reward=0.0, finished=False)

        @tool
        def reveal_raise(self) -> ToolOutput:
            """Tool code that raises with its secrets' values in the message."""
            raise RuntimeError(f"failed with secrets {sorted(self._secrets.values())}")

        @tool
        def finish(self) -> ToolOutput:
            """Ends the episode."""
            return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0, finished=True)
''')

PROBE_MANIFEST = textwrap.dedent('''
    name = "{slug}"
    description = "Test-only probe environment."
    entrypoint = "env:Probe"
    visibility = "private"
    tool_timeout_seconds = {timeout}
    required_secrets = []
''')


# What the first real publish of each probe variant produced in this test run: the database rows
# minus their keys. Publishing runs the inspector in a subprocess (about a second); these tests are
# about the ORS surface, so later tests get the same rows written directly (the package itself is
# content-addressed on disk and shared).
_published: dict[tuple[str, float], dict] = {}


def _values(obj, skip: set[str]) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields if f.attname not in skip}


def _snapshot(version) -> dict:
    from orsplatform.catalog.models import Split, Task

    env = version.environment
    splits = list(Split.objects.filter(environment=env).order_by("id"))
    return {
        "environment": _values(env, {"id", "team_id", "slug", "visibility", "current_version_id", "created_at"}),
        "version": _values(version, {"id", "environment_id", "created_by_id", "created_at"}),
        "splits": [(_values(sp, {"id", "environment_id"}),
                    [_values(t, {"id", "split_id"}) for t in Task.objects.filter(split=sp).order_by("index")])
                   for sp in splits],
    }


def _restore(snapshot: dict, team, slug: str, visibility: str) -> None:
    from django.db import transaction

    from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task

    with transaction.atomic():
        env = Environment.objects.create(team=team, slug=slug, visibility=visibility, **snapshot["environment"])
        version = EnvironmentVersion.objects.create(environment=env, **snapshot["version"])
        for split_values, tasks in snapshot["splits"]:
            split = Split.objects.create(environment=env, **split_values)
            Task.objects.bulk_create([Task(split=split, **t) for t in tasks])
        env.current_version = version
        env.save(update_fields=["current_version"])


def publish_probe_sync(team, tmp_path: Path, *, slug: str = PROBE_SLUG, tool_timeout: float = 30,
                       visibility: str = "private") -> str:
    """Publish the probe package as an environment of ``team`` (private unless told); returns its
    full name."""
    from orsplatform.catalog.services import environment_publish

    key = (slug, tool_timeout)
    snapshot = _published.get(key)
    if snapshot is not None and Path(snapshot["version"]["package_path"]).is_dir():
        _restore(snapshot, team, slug, visibility)
        return f"{team.slug}/{slug}"
    src = tmp_path / f"{slug}_pkg"
    src.mkdir(parents=True, exist_ok=True)
    (src / "env.py").write_text(PROBE_ENV)
    (src / "manifest.toml").write_text(PROBE_MANIFEST.format(slug=slug, timeout=tool_timeout))
    result = environment_publish(team=team, source_dir=src, visibility=visibility)
    _published[key] = _snapshot(result.version)
    return f"{team.slug}/{slug}"


async def in_db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run sync ORM code off the event loop, closing the worker thread's connection afterwards (an
    open connection there would keep PostgreSQL from dropping the test database)."""

    def run() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return await sync_to_async(run)()


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
    return await in_db(session_row, sid)


async def acalls(sid: str | None = None) -> list[dict]:
    return await in_db(tool_call_rows, sid)


async def acount(**filters: Any) -> int:
    return await in_db(session_count, **filters)


def all_rows_dump() -> str:
    """Every Session and ToolCall row, every column, as one string (for leak searches)."""
    from orsplatform.episodes.models import Session, ToolCall

    rows = list(Session.objects.values()) + list(ToolCall.objects.values())
    return json.dumps(rows, default=str)


def sid_headers(person, sid: str) -> dict[str, str]:
    return {**person.headers, "X-Session-ID": sid}


def assert_detail(r, status: int) -> str:
    """The response is ``status`` with a JSON ``{"detail": ...}`` naming what went wrong; the detail."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"detail"} and isinstance(body["detail"], str) and body["detail"], body
    return body["detail"]


def x_secrets(secrets: dict) -> str:
    """The X-Secrets header's value for ``secrets``."""
    return base64.b64encode(json.dumps(secrets).encode()).decode()
