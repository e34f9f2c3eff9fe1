"""Drives evaluation runs: one engine per worker process, on a long-lived event loop in a thread of
its own, with one EpisodeGateway (the inline executor runs environments in this process) and one
pooled HTTP client for the agents. A Celery task hands it a run id and waits.

Per run: up to `concurrency` episodes at once, each an ORS episode on the gateway driven by AAP
turns against the agent. An episode's result is written when it ends, so a worker killed mid-run
loses only the episodes it had open; the run's lease lapses and a resume (or the redelivered task)
runs the rest. A cancel is seen within a second through the lease renewal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from orsplatform.engine.errors import GatewayError, storable
from orsplatform.evals import crypto, egress, services
from orsplatform.evals.aap import AapClient, AapError, Turn, UrlNotAllowed, check_url, for_transcript
from orsplatform.evals.aap_versions import ors_blocks_to_aap, ors_tools_to_aap
from orsplatform.evals.models import EvalRun
from orsplatform.evals.services import EpisodeScore, RunPlan
from orsplatform.sandbox.redact import redact, secret_values

log = logging.getLogger("orsplatform.evals")
T = TypeVar("T")

MAX_TRANSCRIPT_ENTRIES = 400
MAX_RESULT_TEXT = 4000
SETUP_DEADLINE_SECONDS = 300.0
DENIED = "Denied: the evaluation does not permit this server-side tool (it is not trusted for this agent)."


@dataclass
class EpisodeState:
    task_index: int
    sid: str
    reward: float = 0.0
    finished: bool = False
    stop_reason: str = ""
    error: str = ""
    turns: int = 0
    tool_calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    transcript: list[dict] = field(default_factory=list)

    def note(self, entry: dict) -> None:
        if len(self.transcript) < MAX_TRANSCRIPT_ENTRIES:
            self.transcript.append(entry)

    def record_turn(self, turn: Turn) -> None:
        self.note({"kind": "assistant", "turn": self.turns, "blocks": for_transcript(turn.blocks),
                   "stop_reason": turn.stop_reason})
        for result in turn.server_results:
            self.note({"kind": "server_tool_result", "toolCallId": result.get("toolCallId"),
                       "text": _text_of(result.get("content"))[:MAX_RESULT_TEXT]})
        if turn.input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + turn.input_tokens
        if turn.output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + turn.output_tokens


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def tool_reply(result: dict | None, exception: str | None, *,
               version: int = 1) -> tuple[list[dict] | str, float | None, bool, bool]:
    """An ORS call's outcome as AAP tool-result content (in the agent's AAP version), with its
    reward, finished flag and ok. AAP has no error flag on results: a failed call goes back as text
    starting "Error:"."""
    if exception is not None or result is None:
        return f"Error: {exception or 'the call failed'}", None, False, False
    if not result.get("ok"):
        error = result.get("error")
        return f"Error: {error if isinstance(error, str) else error!r}", None, False, False
    output = result.get("output") or {}
    content = ors_blocks_to_aap(output.get("blocks") or [], version) or "(no output)"
    return content, output.get("reward"), bool(output.get("finished")), True


def _open_secrets(plan: RunPlan, sealed: str) -> str:
    """Put the run's secrets from its message into the plan; the reason the run cannot go on, or "".
    Without the secrets it was launched with (a message sent without them, a rotated key), the
    agent would be scored on broken episodes."""
    try:
        plan.secrets = crypto.open_run_secrets(plan.run_id, sealed)
    except ValueError as exc:
        return f"{exc} Resume the run with its secrets."
    if sorted(plan.secrets) != plan.secret_names:
        return "The run's secrets did not reach its worker; resume it with them."
    return ""


class Engine:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # One thread: writes of an episode land in the order they were made (a cancelled episode's
        # release after its start), and SQLite sees a single writer from the engine.
        self.db_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evals-db")
        self.thread = threading.Thread(target=self.loop.run_forever, name="evals-engine", daemon=True)
        self.thread.start()
        self.gateway = None
        self.http: httpx.AsyncClient | None = None
        self.runs: dict[int, Future] = {}
        self.runs_lock = threading.Lock()  # two deliveries of one run in this process chain, never overlap
        # This process's identity in run leases: made here, after any fork (a prefork pool's children
        # must not share one), with a nonce so that a restarted process under a reused pid differs.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"

    # --- entry points (any thread) ----------------------------------------------------------------

    def execute(self, run_id: int, *, sealed_secrets: str = "") -> None:
        # A resume right after a cancel (or a second message for one run): the earlier drive may
        # still be ending its episodes here; the new one starts after it, so no episode is driven
        # twice. (Between processes, the run's lease does the same.)
        with self.runs_lock:
            previous = self.runs.get(run_id)
            future = asyncio.run_coroutine_threadsafe(
                self.drive(run_id, sealed_secrets=sealed_secrets, after=previous), self.loop)
            self.runs[run_id] = future
        future.result()

    def call(self, coro) -> Any:
        """Run a coroutine on the engine's loop and wait for it (tests, the management command)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # --- on the loop ------------------------------------------------------------------------------

    async def db(self, fn: Callable[..., T], **kwargs: Any) -> T:
        def run() -> T:
            # The thread keeps its connection (close_old_connections() would close it on every call
            # with CONN_MAX_AGE=0, a new PostgreSQL backend per write); a broken one is replaced once.
            try:
                return fn(**kwargs)
            except (InterfaceError, OperationalError):
                connection.close()
                return fn(**kwargs)

        return await self.loop.run_in_executor(self.db_pool, run)

    def _start(self) -> None:
        if self.gateway is None:
            from orsplatform.engine.gateway import EpisodeGateway

            self.gateway = EpisodeGateway()
            self.gateway.ensure_background()
            # Connections open only to addresses the egress policy admits, judged when they are
            # opened; no proxy from the environment (it would connect on the platform's behalf).
            self.http = httpx.AsyncClient(
                transport=egress.async_transport(httpx.Limits(max_connections=None, max_keepalive_connections=256)),
                timeout=httpx.Timeout(connect=settings.ORS_EVAL_CONNECT_TIMEOUT_SECONDS,
                                      read=settings.ORS_EVAL_READ_TIMEOUT_SECONDS,
                                      write=settings.ORS_EVAL_CONNECT_TIMEOUT_SECONDS, pool=None),
                follow_redirects=False, trust_env=False)

    async def drive(self, run_id: int, *, sealed_secrets: str = "", after: Future | None = None) -> None:
        self._start()
        if after is not None and not after.done():
            await asyncio.wait([asyncio.wrap_future(after)])
        plan = await self.db(services.eval_run_claim, run_id=run_id, owner=self.owner)
        if plan is None:
            return  # ended, or driven by a live worker elsewhere
        problem = _open_secrets(plan, sealed_secrets)
        try:
            outcome = (EvalRun.Status.FAILED, problem) if problem else await self._drive(plan)
        except Exception as exc:
            log.exception("evaluation run %s failed", run_id)
            outcome = (EvalRun.Status.FAILED, f"The platform could not drive the run: {type(exc).__name__}: {exc}")
        if outcome is not None:
            await self.db(services.eval_run_end, run_id=run_id, owner=self.owner, status=outcome[0],
                          error=outcome[1])

    async def _drive(self, plan: RunPlan) -> tuple[str, str] | None:
        env = await self.gateway.environment(plan.caller, plan.env_ref)
        if env is None or env.version_id != plan.version_id:
            return EvalRun.Status.FAILED, f"Environment {plan.env_ref} is no longer available to the team."
        try:
            await self.loop.run_in_executor(None, check_url, plan.agent_url)
        except UrlNotAllowed as exc:
            return EvalRun.Status.FAILED, str(exc)
        client = AapClient(self.http, url=plan.agent_url, api_key=plan.api_key, stream=plan.agent_stream,
                           turn_timeout=plan.turn_timeout, version=plan.agent_protocol)
        queue = deque(plan.indices)
        stopped = asyncio.Event()

        async def work() -> None:
            while queue and not stopped.is_set():
                await self.episode(plan, env, client, queue.popleft())

        workers = [asyncio.create_task(work()) for _ in range(min(plan.concurrency, len(queue)))]
        watcher = asyncio.create_task(self._watch(plan, workers, stopped))
        try:
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            watcher.cancel()
        return None if stopped.is_set() else (EvalRun.Status.FINISHED, "")

    async def _watch(self, plan: RunPlan, workers: list[asyncio.Task], stopped: asyncio.Event) -> None:
        """Renew the lease; on a cancel (or a takeover) stop starting episodes and end the open ones."""
        every = min(1.0, settings.ORS_EVAL_LEASE_SECONDS / 3)
        while True:
            await asyncio.sleep(every)
            try:
                status = await self.db(services.eval_run_renew, run_id=plan.run_id, owner=self.owner)
            except Exception as exc:  # the database blinked: the lease has slack, try again
                log.warning("could not renew the lease of run %s: %s", plan.run_id, exc)
                continue
            if status != EvalRun.Status.RUNNING:
                stopped.set()
                for worker in workers:
                    worker.cancel()
                return

    # --- one episode ------------------------------------------------------------------------------

    async def _create(self, plan: RunPlan, env, sid: str, index: int):
        # The team's open-session limit (429) and a busy executor (503) are waits, not failures.
        deadline = time.monotonic() + settings.ORS_EVAL_CAPACITY_WAIT_SECONDS
        delay = 0.05
        while True:
            try:
                return await self.gateway.create_episode(plan.caller, sid=sid, env=env, split=plan.split, index=index,
                                                         secrets=plan.secrets, protocol="aap")
            except GatewayError as exc:
                if exc.status not in (429, 503) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _ready(self, live) -> None:
        deadline = time.monotonic() + SETUP_DEADLINE_SECONDS
        while True:
            try:
                await self.gateway.ready(live)
                return
            except GatewayError as exc:
                if exc.status != 503 or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    async def _call(self, plan: RunPlan, live, name: str, tool_input: dict):
        deadline = time.monotonic() + settings.ORS_EVAL_CAPACITY_WAIT_SECONDS
        while True:
            try:
                return await self.gateway.call(plan.caller, live, name, tool_input)
            except GatewayError as exc:  # 429: the team's tool-call rate
                if exc.status != 429 or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)

    async def episode(self, plan: RunPlan, env, client: AapClient, index: int) -> None:
        gw = self.gateway
        started = time.monotonic()
        sid = gw.open_session(plan.caller, secrets={})
        state = EpisodeState(task_index=index, sid=sid)
        live = None
        aap_sid: str | None = None
        told: list[str] = []  # the agent session's id as soon as the agent tells it, even if its turn then fails
        try:
            await self.db(services.eval_episode_start, run_id=plan.run_id, task_index=index, sid=sid)
            live = await self._create(plan, env, sid, index)
            await self._ready(live)
            prompt = await gw.prompt(live)
            tools = await gw.tools(live)
            body = {"agent": {"name": plan.agent_name, "tools": plan.agent_tools, "options": plan.agent_options},
                    "messages": [{"role": "user", "content": ors_blocks_to_aap(prompt, plan.agent_protocol)}],
                    "tools": ors_tools_to_aap(tools, plan.agent_protocol)}
            turn = await self._open_agent_session(client, body, told)
            aap_sid = turn.session_id
            state.turns = 1
            await self._turns(plan, live, client, aap_sid, turn, {t["name"] for t in tools}, state)
        except asyncio.CancelledError:
            # Cancelled run: not scored, so a resume runs it again.
            await self._cleanup(plan, client, aap_sid, sid, live)
            await self.db(services.eval_episode_release, run_id=plan.run_id, task_index=index)
            raise
        except GatewayError as exc:
            state.stop_reason, state.error = "error", f"Environment: {exc.detail}"
        except AapError as exc:
            state.stop_reason, state.error = "error", str(exc)
        except Exception as exc:
            log.exception("episode %s of run %s failed in the platform", index, plan.run_id)
            state.stop_reason, state.error = "error", f"Platform: {type(exc).__name__}: {exc}"
        # A first turn that failed after the agent told the session's id (session_start or v3's
        # POST /sessions, then a malformed or endless turn): the session exists on its server and is
        # deleted too.
        aap_sid = aap_sid or next(iter(told), None)
        # The episode has its result: a cancel from here on must not lose it (nor leave the
        # session open), so clean-up and scoring finish whatever happens to this task.
        finish = asyncio.ensure_future(self._finish(plan, client, aap_sid, sid, live, state,
                                                    round(time.monotonic() - started, 4)))
        try:
            await asyncio.shield(finish)
        except asyncio.CancelledError:
            await finish
            raise

    async def _open_agent_session(self, client: AapClient, body: dict, known: list[str]) -> Turn:
        """Create the agent's session and run its first turn. A cancel while it is in flight must
        not leave the agent's session open on its server: the id arrives with session_start (v1/v2
        stream modes), with the reply ("none"), or before the turn (v3's POST /sessions), so
        the cancel deletes the session at once if its id is known, else waits for it (at most a turn,
        and at most ORS_EVAL_CANCEL_GRACE_SECONDS), then lets the cancel through. `known` gets the id
        as soon as the agent tells it, for the caller to delete the session if the turn fails."""
        told = asyncio.Event()

        def on_session(session_id: str) -> None:
            known.append(session_id)
            told.set()

        put = asyncio.ensure_future(client.create(body, on_session=on_session))
        try:
            return await asyncio.shield(put)
        except asyncio.CancelledError:
            if not put.done() and not told.is_set():
                waiter = asyncio.ensure_future(told.wait())
                await asyncio.wait([put, waiter], return_when=asyncio.FIRST_COMPLETED,
                                   timeout=min(client.turn_timeout, settings.ORS_EVAL_CANCEL_GRACE_SECONDS))
                waiter.cancel()
            if put.done() and not put.cancelled() and put.exception() is None:
                known.append(put.result().session_id or "")
            put.cancel()
            for session_id in dict.fromkeys(filter(None, known)):
                await client.delete(session_id)
            raise

    async def _finish(self, plan: RunPlan, client: AapClient, aap_sid: str | None, sid: str, live,
                      state: EpisodeState, duration_s: float) -> None:
        await self._cleanup(plan, client, aap_sid, sid, live)
        passed = not state.error and state.reward >= plan.pass_threshold
        # Stored like the audit log: an environment (or the agent) may echo a secret it was given.
        secrets = secret_values(plan.secrets)
        await self.db(services.eval_episode_score, run_id=plan.run_id, score=EpisodeScore(
            task_index=state.task_index, sid=sid, reward=state.reward, passed=passed, finished=state.finished,
            stop_reason=state.stop_reason, error=redact(state.error, secrets), turns=state.turns,
            tool_calls=state.tool_calls, input_tokens=state.input_tokens, output_tokens=state.output_tokens,
            transcript=storable(redact(state.transcript, secrets)), duration_s=duration_s))

    async def _turns(self, plan: RunPlan, live, client: AapClient, aap_sid: str, turn: Turn,
                     app_tools: set[str], state: EpisodeState) -> None:
        server_tools = {t["name"]: t["trust"] for t in plan.agent_tools}
        while True:
            state.record_turn(turn)
            if turn.stop_reason != "tool_use":
                state.stop_reason = turn.stop_reason
                if turn.stop_reason == "error":
                    state.error = "The agent ended its turn with stopReason error."
                return
            answered = {r.get("toolCallId") for r in turn.server_results}
            replies: list[dict] = []
            for use in turn.tool_uses:
                if use.name in app_tools:
                    entry = await self._call(plan, live, use.name, use.input)
                    content, reward, finished, ok = tool_reply(*entry.outcome(), version=plan.agent_protocol)
                    state.tool_calls += 1
                    if reward is not None:
                        state.reward += reward
                    replies.append({"role": "tool", "toolCallId": use.id, "content": content})
                    state.note({"kind": "tool", "name": use.name, "toolCallId": use.id, "task_id": entry.task_id,
                                "ok": ok, "text": _text_of(content)[:MAX_RESULT_TEXT], "reward": reward,
                                "finished": finished})
                    if finished:
                        state.finished = True
                        break  # the episode is over: later calls of this turn would act on nothing
                elif use.name in server_tools and not server_tools[use.name]:
                    replies.append({"role": "tool_permission", "toolCallId": use.id, "granted": False,
                                    "reason": DENIED})
                    state.note({"kind": "permission", "name": use.name, "toolCallId": use.id, "granted": False,
                                "reason": DENIED})
                elif use.name in server_tools or use.id in answered:
                    continue  # a trusted server-side tool: the agent's server runs it
                else:
                    text = f"Error: unknown tool {use.name!r}."
                    replies.append({"role": "tool", "toolCallId": use.id, "content": text})
                    state.note({"kind": "tool", "name": use.name, "toolCallId": use.id, "ok": False, "text": text,
                                "reward": None, "finished": False})
            if state.finished:
                state.stop_reason = "finished"
                return
            if not replies:
                raise AapError("Malformed reply: a tool_use stop without a tool call to answer.")
            if state.turns >= plan.max_turns:
                state.stop_reason = "max_turns"
                state.error = f"The agent did not finish the episode within {plan.max_turns} turns."
                return
            # Every result and permission decision of this stop goes back in one turn.
            turn = await client.send(aap_sid, {"messages": replies})
            state.turns += 1

    async def _cleanup(self, plan: RunPlan, client: AapClient, aap_sid: str | None, sid: str, live) -> None:
        if aap_sid:
            await client.delete(aap_sid)
        # Also without `live`: a cancel inside create_episode may leave its row (and instance) behind.
        try:
            await self.gateway.end(plan.caller, sid)
        except GatewayError as exc:
            if live is not None or exc.status != 404:  # 404: the episode was never created
                log.warning("could not end session %s: %s", sid, exc.detail)
        except Exception as exc:
            log.warning("could not end session %s: %s", sid, exc)


_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine() -> Engine:
    """This process's engine, started on first use (after a Celery fork, never before it)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine()
        return _engine
