"""Running a tool call, whatever face asked for it.

A call runs as its own task, not inside the request that started it: a client that disconnects
mid-call does not cancel it, its audit row is still written, and a reconnect with the same task_id
gets its result. The result is recorded in the audit log before any client can see it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import orjson

from orsplatform.engine.errors import storable
from orsplatform.engine.hints import unknown_tool
from orsplatform.engine.ids import call_id
from orsplatform.engine.live import CallEntry, LiveSession
from orsplatform.engine.store import Store
from orsplatform.episodes.models import ToolCall
from orsplatform.executors.executor import CallOutcome, Executor, UnknownSession
from orsplatform.sandbox.redact import redact

log = logging.getLogger("orsplatform.engine")

Spawn = Callable[[Coroutine], Any]
TASK_TOOLS_WAIT = 5.0  # seconds an unknown tool's answer waits for the task's own tool list


class CallRunner:
    def __init__(self, *, executor: Executor, store: Store, spawn: Spawn) -> None:
        self.executor = executor
        self.store = store
        self.spawn = spawn
        # Finished calls kept for reconnects, oldest first: (finished_at, its session's calls,
        # task id). The reaper drops the expired from the front, so its cost is the calls that
        # expire, not every call of every open session.
        self.lingering: deque[tuple[float, dict[str, CallEntry], str]] = deque()

    def start(self, live: LiveSession, name: str, tool_input: dict, *, lingers: bool = True) -> CallEntry:
        entry = CallEntry(task_id=call_id(), lingers=lingers)
        live.calls[entry.task_id] = entry
        # The gateway's set of background tasks holds the task; the entry does not (a finished
        # task, its coroutine and context would linger with the result: CallEntry.settle).
        self.spawn(self._run(live, entry, name, tool_input))
        return entry

    def expire(self, now: float, linger: float) -> None:
        """Drop the finished calls kept longer than `linger` seconds."""
        lingering = self.lingering
        while lingering and now - lingering[0][0] > linger:
            _, calls, task_id = lingering.popleft()
            calls.pop(task_id, None)

    async def _run(self, live: LiveSession, entry: CallEntry, name: str, tool_input: dict) -> None:
        # Whatever happens below, the waiting stream must end: `done` is set in the finally.
        recorded = False
        try:
            started_at = datetime.now(UTC)  # timezone.now() without its settings lookup (USE_TZ is on)
            audit_input = storable(redact(tool_input, live.secrets))
            # Shared executors keep the running call findable by other gateways (reconnects) and by
            # the sweeper that records it should this gateway die; the audit row is written once, below.
            note = {"sid": live.sid, "session_pk": live.pk, "name": name, "input": audit_input,
                    "started_at": started_at.isoformat()} if self.executor.shared else None
            outcome, encoded = await self._execute(live, name, tool_input, entry.task_id, note)
            live.count_call(outcome.result)
            # The audit log's copy is made by the platform from the very result the agent is sent:
            # the executor's copy (it holds the secrets; on the celery executor it is the runner
            # node, platform code) stripped again with the secrets this gateway holds. A sandbox
            # worker's own copies are never read. NUL characters (which PostgreSQL cannot store)
            # are replaced only when the encoded result shows one, so an ordinary call is not walked.
            audit_result = redact(outcome.audit if outcome.audit is not None else outcome.result, live.secrets)
            if (encoded is not None and b"\\u0000" in encoded) or outcome.audit is not None:
                audit_result = storable(audit_result)
            # The input recorded is the one this gateway received; the executor's stripped copy
            # only when this gateway holds no secrets (a session another gateway created).
            if outcome.audit_input is not None and not live.secrets:
                audit_input = storable(outcome.audit_input)
            exception = storable(redact(outcome.exception, live.secrets))
            try:
                await self.store.tool_call_record(
                    session_pk=live.pk, task_id=entry.task_id, name=storable(name), input=audit_input,
                    result=audit_result, exception=exception, started_at=started_at, finished_at=datetime.now(UTC),
                )
                recorded = True
            except Exception:
                log.exception("could not record tool call %s of session %s", entry.task_id, live.sid)
            entry.result = outcome.result if encoded is not None else None
            entry.encoded = encoded
            entry.exception = exception
        except Exception as exc:
            log.exception("tool call %s of session %s failed in the platform", entry.task_id, live.sid)
            entry.exception = f"The platform could not complete the call ({type(exc).__name__})."
        finally:
            entry.finished_at = time.monotonic()
            live.touch()
            if entry.lingers:
                self.lingering.append((entry.finished_at, live.calls, entry.task_id))
                entry.settle()  # wakes its stream, then keeps only the JSON
            else:
                live.calls.pop(entry.task_id, None)
                entry.done.set()
        if recorded:
            # After the stream is woken: the client does not wait for this clean-up.
            try:
                await self.executor.forget_call(entry.task_id)
            except Exception as exc:  # the marker expires on its own; the sweeper finds the row written
                log.warning("could not drop the marker of call %s: %s", entry.task_id, exc)

    async def _execute(self, live: LiveSession, name: str, tool_input: dict, task_id: str,
                       note: dict | None) -> tuple[CallOutcome, bytes | None]:
        """The call's outcome and its result encoded once for the wire (None without a result)."""
        try:
            outcome = await self.executor.call(live.sid, name, tool_input, live.env.tool_timeout, task_id, note)
        except UnknownSession:
            return CallOutcome(exception="Session was deleted during the call."), None
        if outcome.result is None:
            return outcome, None
        if not outcome.result["ok"] and outcome.result.get("reason") == "not_found":
            outcome = await self._name_the_tools(live, name, outcome)
        try:
            return outcome, orjson.dumps(outcome.result)
        except (TypeError, orjson.JSONEncodeError) as exc:
            # e.g. a lone surrogate in a text block: the result cannot go on the wire or in the log.
            return CallOutcome(exception=f"The tool's result is not valid JSON: {exc}"), None

    async def _name_the_tools(self, live: LiveSession, name: str, outcome: CallOutcome) -> CallOutcome:
        """An unknown tool's error, listing the tools the episode has (the shared ones stored at
        publishing, and the task's own, asked for only now: this is the error path)."""
        tools = [t["name"] for t in live.env.tools]
        try:
            # Bounded: a slow list_task_tools must not hold the agent's answer for long.
            tools += [t["name"] for t in await asyncio.wait_for(self.executor.task_tools(live.sid), TASK_TOOLS_WAIT)]
        except Exception as exc:  # the shared tools alone still name the fix
            log.info("could not list the task tools of session %s: %s", live.sid, type(exc).__name__)
        error = redact(unknown_tool(name, tools), live.secrets)
        return dataclasses.replace(outcome, result={**outcome.result, "error": error},
                                   audit=None if outcome.audit is None else {**outcome.audit, "error": error})

    async def entry_from_audit(self, live: LiveSession, task_id: str) -> CallEntry | None:
        """A call this gateway no longer (or never) held in memory: from the audit log, or still
        running on another gateway's runner (shared executors)."""
        row = await self.store.tool_call_result(live.pk, task_id)
        if row is None:
            running = await self.executor.call_record(task_id)
            if running is None or running.get("sid") != live.sid:
                return None
            # Still running, started on another gateway: wait for the runner's result like it does.
            entry = CallEntry(task_id=task_id)
            self.spawn(self._follow(live, entry))
            return entry
        status, result, error = row
        entry = CallEntry(task_id=task_id)
        if status == ToolCall.Status.RUNNING:
            entry.exception = "The call was interrupted."
        elif result is not None:
            if "truncated_output" in result:  # the audit log's own addition to an over-limit answer
                result = {k: v for k, v in result.items() if k != "truncated_output"}
            entry.result = result
        else:
            entry.exception = error or "The call failed."
        entry.done.set()
        return entry

    async def _follow(self, live: LiveSession, entry: CallEntry) -> None:
        try:
            outcome = await self.executor.wait_result(entry.task_id, live.runner, live.env.tool_timeout)
            if outcome.result is None:
                entry.exception = redact(outcome.exception, live.secrets)
            else:
                entry.result = outcome.result
                entry.exception = redact(outcome.exception, live.secrets)
        except Exception as exc:
            entry.exception = f"The platform could not follow the call ({type(exc).__name__})."
        finally:
            entry.finished_at = time.monotonic()
            entry.done.set()
