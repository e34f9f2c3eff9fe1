"""Replays episodes against one environment version's code in the sandbox, with no database and
no Django: the caller hands in the episodes (task spec and tool calls in order) and gets back what
each call scored. Episodes share sandbox workers: one InlineExecutor, whose pool keeps a worker per
(version, team) and starts another only once one holds ORS_SANDBOX_SESSIONS_PER_WORKER sessions,
so a thousand episodes cost a few worker starts, never one per episode."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orsplatform.executors.executor import CallOutcome, SessionSpec, SetupFailed, SetupPending, UnknownSession
from orsplatform.executors.inline import InlineExecutor


@dataclass(frozen=True)
class Outcome:
    """What one call scored; compared between versions (the output's text is not: rewards are)."""

    kind: str  # ok | tool_error (ok=false) | exception (the environment raised) | lost
    reward: float | None = None
    finished: bool = False

    def as_dict(self) -> dict:
        return {"kind": self.kind, "reward": self.reward, "finished": self.finished}


@dataclass(frozen=True)
class Call:
    name: str
    input: dict
    recorded: Outcome | None = None  # what the recorded version answered (None: a reference solution)


@dataclass(frozen=True)
class Episode:
    key: str  # the recorded session's id, or "solution:<line>"
    task: str  # "split/index", or "spec:<hash>" for a session opened with a task object
    task_spec: Any
    calls: tuple[Call, ...]


@dataclass
class Replayed:
    episode: Episode
    outcomes: list[Outcome] = field(default_factory=list)
    setup_error: str | None = None


@dataclass
class Progress:
    """Episodes replayed so far; read by another thread (an int store is atomic under the GIL)."""

    done: int = 0


def outcome_of(result: dict | None) -> Outcome:
    """A recorded ToolCall's wire result ({"ok": ..., "output": ...}) or a CallOutcome's result."""
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        return Outcome("exception")
    if not result["ok"]:
        return Outcome("tool_error")
    output = result.get("output") if isinstance(result.get("output"), dict) else {}
    reward = output.get("reward")
    reward = float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None
    return Outcome("ok", reward, bool(output.get("finished")))


def _outcome(call: CallOutcome) -> Outcome:
    return Outcome("exception") if call.exception is not None else outcome_of(call.result)


async def _replay_one(executor: InlineExecutor, episode: Episode, *, package_dir: str, entrypoint: str,
                      team: str, label: str, tool_timeout: float, setup_timeout: float) -> Replayed:
    sid = f"replay-{uuid.uuid4().hex}"
    done = Replayed(episode)
    # No secrets: recorded sessions' secrets were never stored, and the replay has none to give.
    await executor.start(SessionSpec(sid=sid, package_path=package_dir, entrypoint=entrypoint,
                                     task_spec=episode.task_spec, owner={"team": team, "env": label}))
    try:
        try:
            await executor.wait_ready(sid, setup_timeout)
        except (SetupFailed, SetupPending, UnknownSession) as exc:
            done.setup_error = str(exc)[:500] or type(exc).__name__
            return done
        for call in episode.calls:
            try:
                done.outcomes.append(_outcome(await executor.call(sid, call.name, call.input, tool_timeout)))
            except UnknownSession:  # its worker ended: the rest of the episode cannot run
                done.outcomes.append(Outcome("lost"))
                break
        return done
    finally:
        await executor.stop(sid)


async def replay_async(episodes: Sequence[Episode], *, package_dir: str, entrypoint: str, team: str, label: str,
                       tool_timeout: float, setup_timeout: float, concurrency: int, threads: int,
                       progress: Progress | None = None) -> list[Replayed]:
    """Every episode, ``concurrency`` at a time, in order of the input."""
    executor = InlineExecutor(threads=threads)
    gate = asyncio.Semaphore(concurrency)

    async def one(episode: Episode) -> Replayed:
        async with gate:
            try:
                return await _replay_one(executor, episode, package_dir=package_dir, entrypoint=entrypoint,
                                         team=team, label=label, tool_timeout=tool_timeout,
                                         setup_timeout=setup_timeout)
            finally:
                if progress is not None:
                    progress.done += 1

    try:
        return list(await asyncio.gather(*(one(e) for e in episodes)))
    finally:
        await executor.close()


def replay_in_thread(episodes: Sequence[Episode], *, progress: Progress, **options) -> threading.Thread:
    """Runs replay_async on an event loop of its own thread (the caller, a Celery task, is
    synchronous and writes progress to the database meanwhile); the thread's ``result`` or
    ``error`` attribute holds the outcome once it has ended."""

    def run() -> None:
        try:
            thread.result = asyncio.run(replay_async(episodes, progress=progress, **options))
        except BaseException as exc:  # handed to the caller, which records it
            thread.error = exc

    thread = threading.Thread(target=run, name="replay", daemon=True)
    thread.result, thread.error = None, None
    thread.start()
    return thread
