"""Where environment instances live. The ORS views talk only to this interface, so a backend that
keeps instances on other machines (Celery runner nodes) slots in without touching them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
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
    # Who the session belongs to ({"pk", "team", "version", "runner"}): shared executors keep it
    # with the session so another gateway can serve it without reading the database.
    owner: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CallOutcome:
    """What a tool call produced. ``result`` is the ORS result object ({"ok": ...}) when the call
    completed (successfully or with a tool-level error); ``exception`` is set instead when the
    environment's code raised, which the stream reports as an ``error`` event."""

    result: dict | None = None
    exception: str | None = None
    # The result and the tool input with the session's secret values stripped, for the audit log,
    # when they contained one (set by the executor that holds the secrets, which a gateway serving
    # a session another gateway created does not; None: the original is safe to store).
    audit: dict | None = None
    audit_input: dict | None = None

    @property
    def ok(self) -> bool:
        return bool(self.result and self.result.get("ok"))


class SetupPending(Exception):
    """setup() has not finished within the wait bound."""


class SetupFailed(Exception):
    """setup() (or the environment's constructor) raised."""


class UnknownSession(Exception):
    """The executor holds no instance for this session."""


class RunnerLost(UnknownSession):
    """The runner node holding the session stopped (celery executor)."""


class NoRunnerAvailable(Exception):
    """No live runner node can take a new session (celery executor); worth a retry."""


class WorkerLost(UnknownSession):
    """The sandbox worker holding the session ended (a crash, os._exit, a limit, a tool killed
    after its timeout); str(exc) says why and names the environment."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RunnerUnavailable(Exception):
    """The session's runner did not answer within the bound (celery executor); worth a retry."""


class Executor(ABC):
    # Whether sessions live outside the gateway process (so any gateway may serve any session).
    shared: bool = False
    # Set by the gateway: called with a session's id when a shared executor hears that another
    # gateway ended it, so this gateway stops serving (and writing the activity of) its copy.
    on_gone: Callable[[str], None] | None = None

    async def place(self, team: str | None = None) -> str:
        """Choose where a new session of `team` (a slug) runs; the name is recorded on the session."""
        return "inline"

    def keep_warm(self, wanted: dict[str, str]) -> None:  # noqa: B027 - a no-op unless workers are local
        """Hold a started worker for each of these packages (dir -> label) ahead of its first
        session, and none for any other (containers/warm.py chooses them)."""

    def attach(self, sid: str, runner: str) -> None:  # noqa: B027 - a no-op unless sessions are shared
        """Tell this gateway where an existing session runs (one created by another gateway)."""

    def detach(self, sid: str) -> None:  # noqa: B027 - a no-op unless sessions are shared
        """This gateway stops serving a shared session (ended elsewhere, or not asked for in a
        while); the instance itself is left alone."""

    def prompt_audit(self, sid: str) -> list[dict] | None:
        """The initial prompt with the session's secret values stripped, when the executor holding
        the secrets made one because the prompt contained one (None: redact it with the secrets
        the gateway has, if any)."""
        return None

    async def recorded_prompt(self, sid: str) -> list[dict] | None:
        """The initial prompt a shared executor recorded for the session when its setup ended,
        stripped of the session's secret values (None: none recorded, or not a shared executor)."""
        return None

    @abstractmethod
    async def start(self, spec: SessionSpec, runner: str = "") -> None:
        """Begin creating the instance and running setup() in the background; return at once."""

    @abstractmethod
    async def wait_ready(self, sid: str, timeout: float) -> None:
        """Wait for setup. Raises SetupPending, SetupFailed or UnknownSession."""

    def ready_now(self, sid: str) -> bool:
        """True when the session is set up and its process alive, known without waiting (the
        hot path's check before every call); False means "ask wait_ready"."""
        return False

    @abstractmethod
    async def prompt(self, sid: str) -> list[dict]:
        """The task's prompt blocks, as wire dicts."""

    @abstractmethod
    async def task_tools(self, sid: str) -> list[dict]:
        """The task-specific tool specs (list_task_tools), as wire dicts; shared ones are stored."""

    async def native_state(self, sid: str) -> dict:
        """The state of an OpenEnv environment whose answers do not carry it (a container's server is
        asked for it only when a client asks: OpenEnv's own client sends ``state`` when it wants it)."""
        raise UnknownSession(sid)

    @abstractmethod
    async def call(self, sid: str, name: str, input: dict, timeout: float, task_id: str = "",
                   note: dict | None = None) -> CallOutcome:
        """Run one tool call; calls of one session run one at a time, and none after a call
        returned finished=True (those answer ok=false, reason episode_finished). Shared executors
        keep `note` (the call's redacted audit data) while it runs, so another gateway can follow
        the call and a sweeper can record it should this gateway die."""

    async def shared_record(self, sid: str) -> dict | None:
        """The session's record kept by a shared executor (state and SessionSpec.owner), so a
        gateway that did not create it can serve it without a database read; None if unknown."""
        return None

    async def forget_call(self, task_id: str) -> None:  # noqa: B027 - no-op unless shared
        """The call's audit row is written; drop the note kept while it ran."""

    async def call_record(self, task_id: str) -> dict | None:
        """The note kept for a call still running somewhere (shared executors)."""
        return None

    @abstractmethod
    async def stop(self, sid: str) -> None:
        """Tear the instance down (teardown()); a no-op for an unknown session."""

    @abstractmethod
    async def close(self) -> None:
        """Release the backend's resources when the gateway shuts down."""
