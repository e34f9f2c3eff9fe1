"""Where environment instances live. The ORS views talk only to this interface, so a backend that
keeps instances on other machines (Celery runner nodes) slots in without touching them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SessionSpec:
    sid: str
    package_path: str
    entrypoint: str
    task_spec: Any
    # Secrets live only in the memory of the process that runs the instance.
    secrets: dict[str, str] = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class CallOutcome:
    """What a tool call produced. ``result`` is the ORS result object ({"ok": ...}) when the call
    completed (successfully or with a tool-level error); ``exception`` is set instead when the
    environment's code raised, which the stream reports as an ``error`` event."""

    result: dict | None = None
    exception: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.result and self.result.get("ok"))


class SetupPending(Exception):
    """setup() has not finished within the wait bound."""


class SetupFailed(Exception):
    """setup() (or the environment's constructor) raised."""


class UnknownSession(Exception):
    """The executor holds no instance for this session."""


class Executor(ABC):
    # Whether sessions live outside the gateway process (so any gateway may serve any session).
    shared: bool = False

    async def place(self, team: str | None = None) -> str:
        """Choose where a new session of `team` (a slug) runs; the name is recorded on the session."""
        return "inline"

    def attach(self, sid: str, runner: str) -> None:  # noqa: B027 - a no-op unless sessions are shared
        """Tell this gateway where an existing session runs (one created by another gateway)."""

    @abstractmethod
    async def start(self, spec: SessionSpec, runner: str = "") -> None:
        """Begin creating the instance and running setup() in the background; return at once."""

    @abstractmethod
    async def wait_ready(self, sid: str, timeout: float) -> None:
        """Wait for setup. Raises SetupPending, SetupFailed or UnknownSession."""

    @abstractmethod
    async def prompt(self, sid: str) -> list[dict]:
        """The task's prompt blocks, as wire dicts."""

    @abstractmethod
    async def task_tools(self, sid: str) -> list[dict]:
        """The task-specific tool specs (list_task_tools), as wire dicts; shared ones are stored."""

    @abstractmethod
    async def call(self, sid: str, name: str, input: dict, timeout: float, task_id: str = "") -> CallOutcome:
        """Run one tool call; calls of one session run one at a time, and none after a call
        returned finished=True (those answer ok=false, reason episode_finished)."""

    async def note_call(self, task_id: str, record: dict) -> None:  # noqa: B027 - no-op unless shared
        """Remember a call while it runs (shared executors: so another gateway can follow it, and a
        sweeper can record it if this gateway dies); `record` is its (redacted) audit data."""

    async def forget_call(self, task_id: str) -> None:  # noqa: B027 - no-op unless shared
        """The call's audit row is written; drop what note_call kept."""

    async def call_record(self, task_id: str) -> dict | None:
        """What note_call kept for a call still running somewhere (shared executors)."""
        return None

    @abstractmethod
    async def stop(self, sid: str) -> None:
        """Tear the instance down (teardown()); a no-op for an unknown session."""

    @abstractmethod
    async def close(self) -> None:
        """Release the backend's resources when the gateway shuts down."""
