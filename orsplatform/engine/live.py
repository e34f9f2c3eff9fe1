"""The gateway's view of open sessions: who owns them, when they were last active, and the
results of their recent tool calls (kept for reconnects). Pings only touch this memory."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.engine.errors import GatewayError
from orsplatform.episodes.services import SessionTotals
from orsplatform.executors.executor import RunnerLost, UnknownSession, WorkerLost


def _finished_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()  # never waited on (wait() returns at once), so it belongs to no event loop
    return event


# What every settled call's `done` becomes (CallEntry.settle).
FINISHED = _finished_event()


@dataclass(slots=True)
class CallEntry:
    task_id: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The result as data ({"ok": ...}), whatever face asked: each face encodes it for its own wire.
    result: dict | None = None
    exception: str | None = None  # set instead when the environment's code raised
    finished_at: float | None = None
    # Kept ORS_RESULT_LINGER_SECONDS after it finishes, for a reconnect by task id (ORS streams);
    # a call its face awaits whole (OpenEnv, evaluations) has none and goes when it finishes.
    lingers: bool = True
    # The result's JSON when the gateway already made it (checking that the result can be stored
    # and sent, calls.py): a face whose wire carries the result as plain JSON (ORS) sends these
    # bytes instead of encoding the same dict again. Once the call is settled, the only copy.
    encoded: bytes | None = field(default=None, repr=False)

    def settle(self) -> None:
        """A finished call that lingers keeps only what a reconnect reads: its JSON (bytes, which
        the garbage collector does not track) or its error. Its own Event (with its waiter queue)
        and the result's dicts and lists would be a dozen tracked objects a call; with 100,000
        calls lingering (820 calls/s for 120 s) every collection walked them, and a young one took
        100-200 ms of the event loop holding 16,384 ORS sessions (docs/many-sockets.md)."""
        self.done.set()
        self.done = FINISHED
        if self.encoded is not None:
            self.result = None

    def outcome(self) -> tuple[dict | None, str | None]:
        """(the result, None) or (None, the error) of a finished call."""
        if self.exception is not None:
            return None, self.exception
        if self.result is None and self.encoded is not None:
            return orjson.loads(self.encoded), None  # a settled call, read again (a reconnect)
        return self.result, None

    def result_json(self) -> bytes:
        """The result as JSON (b"" without one), for faces that send it as it is."""
        if self.encoded is None and self.result is not None:
            self.encoded = orjson.dumps(self.result)
        return self.encoded or b""


@dataclass
class LiveSession:
    sid: str
    pk: int
    team_id: int | None
    env: EnvHandle
    runner: str = "inline"
    # For a session adopted from the database (created by another gateway): when its row was read.
    adopted_at: float | None = None
    last_activity: float = field(default_factory=time.monotonic)
    flushed_activity: float = 0.0
    prompt_recorded: bool = False
    # The first prompt's audit copy, until written (with the activity flush or the session's end).
    prompt_unwritten: list[dict] | None = None
    # Whether /create took one of the team's open-session slots (teams without a limit take none).
    holds_slot: bool = True
    # Set in memory when setup() finishes; written with the coalesced activity flush and at the end.
    ready_at: datetime | None = None
    ready_flushed: bool = False
    finished: bool = False
    deleted: bool = False
    calls: dict[str, CallEntry] = field(default_factory=dict)
    # Running totals, written once when the session ends.
    call_count: int = 0
    total_reward: float | None = None
    # The session's secret values, only to strip them from the audit log's copy of each call.
    secrets: tuple[str, ...] = field(default=(), repr=False)
    protocol: str = "ors"
    # The task as its caller may see it (hidden fields dropped; None for a sealed split unless the
    # caller holds a publish key of its owners), and where it is stored, if known.
    task_public: Any = None
    split: str = ""
    index: int | None = None

    def count_call(self, result: dict | None) -> None:
        self.call_count += 1
        if result and result.get("ok"):
            output = result["output"]
            if output.get("reward") is not None:
                self.total_reward = (self.total_reward or 0.0) + output["reward"]
            if output.get("finished"):
                self.finished = True

    def totals(self) -> SessionTotals:
        return SessionTotals(calls=self.call_count, total_reward=self.total_reward, finished=self.finished)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def busy(self) -> bool:
        return any(not c.done.is_set() for c in self.calls.values())

    def last_activity_at(self) -> datetime:
        return datetime.fromtimestamp(time.time() - (time.monotonic() - self.last_activity), UTC)


@dataclass
class PendingSid:
    """A minted sid and what /create_session carried (X-Secrets), until /create uses it."""

    team_id: int | None
    secrets: dict[str, str] = field(repr=False, default_factory=dict)
    created: float = field(default_factory=time.monotonic)


@dataclass
class DeferredEpisode:
    """A /create that named no environment: the episode is created on the environment the
    session's first environment-scoped request names (see EpisodeGateway.session)."""

    team_id: int | None
    task_spec: Any
    split: str | None
    index: int | None
    protocol: str
    holds_slot: bool
    runner: str
    secrets: dict[str, str] = field(repr=False, default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    binding: asyncio.Future | None = None
    run: str | None = None  # the training run the create named (X-Run / `run`), if any


def instance_gone(exc: UnknownSession) -> GatewayError:
    """The answer when the executor no longer holds a session the gateway still knew."""
    if isinstance(exc, RunnerLost):
        return GatewayError(410, "Session lost: the runner that held it stopped.")
    if isinstance(exc, WorkerLost) and exc.reason:
        return GatewayError(410, f"Session lost: {exc.reason}")
    return GatewayError(410, "Session was deleted.")
