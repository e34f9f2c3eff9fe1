"""The gateway's view of open sessions: who owns them, when they were last active, and the
results of their recent tool calls (kept for reconnects). Pings only touch this memory."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orsplatform.catalog.selectors import EnvHandle


@dataclass
class CallEntry:
    task_id: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result_json: str | None = None  # the wire result ({"ok": ...}) once finished
    exception: str | None = None  # set instead when the environment's code raised
    finished_at: float | None = None
    task: asyncio.Task | None = None


@dataclass
class LiveSession:
    sid: str
    pk: int
    team_id: int | None
    env: EnvHandle
    last_activity: float = field(default_factory=time.monotonic)
    flushed_activity: float = 0.0
    finished: bool = False
    deleted: bool = False
    calls: dict[str, CallEntry] = field(default_factory=dict)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def busy(self) -> bool:
        return any(not c.done.is_set() for c in self.calls.values())

    def last_activity_at(self) -> datetime:
        return datetime.fromtimestamp(time.time() - (time.monotonic() - self.last_activity), UTC)


@dataclass
class PendingSid:
    """A minted sid and what /create_session carried (X-Secrets, env), until /create uses it."""

    team_id: int | None
    secrets: dict[str, str] = field(repr=False, default_factory=dict)
    env_vars: dict[str, str] = field(repr=False, default_factory=dict)
    created: float = field(default_factory=time.monotonic)
