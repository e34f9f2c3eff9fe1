"""EpisodeGateway: the protocol-neutral core of an episode.

One per process. It resolves environments for a caller, opens sessions, creates episodes, waits for
setup, serves prompts, task tools and tool calls, and ends episodes; it owns the live-session
registry, the executor, the team limits and the durable writes; the reaper, the activity flush and
the warm containers are its background half (engine/background.py). Faces (the ORS app, the OpenEnv
consumer, the AAP evaluator) parse their wire, ask the gateway, and map its ``GatewayError`` onto
their wire; none of them touches the executor or the store for an episode.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from orsplatform.catalog import hidden
from orsplatform.catalog.selectors import EnvHandle, SplitInfo
from orsplatform.engine import hints
from orsplatform.engine.background import GatewayBackground
from orsplatform.engine.calls import CallRunner
from orsplatform.engine.errors import GatewayError, storable
from orsplatform.engine.limits import Limits
from orsplatform.engine.live import CallEntry, DeferredEpisode, LiveSession, PendingSid, instance_gone
from orsplatform.engine.secrets import secrets_admitted
from orsplatform.engine.store import Store
from orsplatform.episodes.models import Session
from orsplatform.executors.executor import (
    Executor,
    NoRunnerAvailable,
    RunnerUnavailable,
    SessionSpec,
    SetupFailed,
    SetupPending,
    UnknownSession,
)
from orsplatform.runs.naming import run_name_for
from orsplatform.sandbox.redact import redact, secret_values
from orsplatform.teams.auth import Access, Caller, authorize_async

log = logging.getLogger("orsplatform.engine")

# team/slug@N as a client may write it; anything else names no environment (and never reaches SQL).
ENV_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}(/[A-Za-z0-9][A-Za-z0-9._-]{0,62})?(@[0-9]{1,9})?$")
MAX_PENDING = 200_000
OPEN = (Session.Status.CREATING, Session.Status.READY)


def make_executor() -> Executor:
    if settings.ORS_EXECUTOR == "inline":
        from orsplatform.executors.inline import InlineExecutor

        return InlineExecutor(threads=settings.ORS_TOOL_THREADS)
    if settings.ORS_EXECUTOR == "celery":
        from orsplatform.executors.remote import CeleryExecutor

        return CeleryExecutor()
    raise RuntimeError(f"Unknown ORS_EXECUTOR {settings.ORS_EXECUTOR!r}")


class EpisodeGateway(GatewayBackground):
    def __init__(self, *, executor: Executor | None = None, store: Store | None = None) -> None:
        self.executor = executor or make_executor()
        self.store = store or Store(threads=1 if "sqlite" in settings.DATABASES["default"]["ENGINE"] else 4)
        self.limits = Limits()
        self.sessions: dict[str, LiveSession] = {}
        self.pending: dict[str, PendingSid] = {}
        self.deferred: dict[str, DeferredEpisode] = {}
        self.calls = CallRunner(executor=self.executor, store=self.store, spawn=self.spawn)
        self.executor.on_gone = self._ended_elsewhere
        self._reaper: asyncio.Task | None = None
        self._warmer: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    # --- callers and environments -------------------------------------------------------------

    async def authorize(self, token: str | None, access: Access) -> Caller:
        """teams.auth's policy, with a key-cache miss looked up on a DB thread. Raises AuthError."""
        return await authorize_async(token, access, self.store.run)

    async def environment(self, caller: Caller, ref: str) -> EnvHandle | None:
        """The environment `ref` (slug, team/slug, either @N) names for the caller; None when it
        names none the caller may use (another team's private one included)."""
        return await self.store.environment(caller, ref) if ENV_REF_RE.match(ref) else None

    async def unknown_environment(self, caller: Caller, ref: str, *, deployment: bool = False) -> GatewayError:
        """404 for a name that resolves to nothing the caller may use, suggesting the closest name
        it may use (difflib) so a typo names its fix. The suggestion comes only from names the
        caller may list itself, so another team's private environment still answers like a
        missing one."""
        names = await self.store.environment_names(caller)
        return hints.unknown_environment(ref, hints.closest_name(ref, names), deployment=deployment)

    async def default_environment(self, caller: Caller) -> EnvHandle | None:
        """For a caller that names none: its key's bound environment, else ORS_DEFAULT_ENVIRONMENT."""
        if caller.environment_id is not None:
            env = await self.store.environment_by_id(caller, caller.environment_id)
            if env is not None:
                return env
        if settings.ORS_DEFAULT_ENVIRONMENT:
            return await self.store.environment(caller, settings.ORS_DEFAULT_ENVIRONMENT)
        return None

    async def task_spec(self, env: EnvHandle, split_name: str, index: int) -> Any:
        split = hints.split_named(env, split_name)
        if not 0 <= index < split.num_tasks:
            raise hints.index_out_of_range(split, index)
        spec = await self.store.task_spec(split, index)
        if spec is None:
            raise hints.index_out_of_range(split, index)
        return spec

    async def task_rehydrate(self, env: EnvHandle, task_spec: Any) -> tuple[str | None, int | None, Any]:
        """(split, index, full spec) of the stored task a client's task object is (it read the
        task without its hidden fields, and the environment's code needs all of them). An object
        that matches nothing is refused, unless some split hides nothing (then it may be one of
        that split's tasks or the caller's own, and runs as given: it reveals nothing hidden)."""
        match = await self.store.task_match(env, task_spec)
        if match is not None:
            info, index, full = match
            return info.name, index, full
        if all(info.hidden for info in env.splits.values()):
            raise GatewayError(400, "task_spec matches no task of this environment: its tasks have hidden fields, "
                                    "so a task object must be one read from task, tasks or task_range "
                                    "(unchanged), or name the task by split and index.")
        return None, None, task_spec

    def task_reader(self, caller: Caller, env: EnvHandle, split_name: str) -> SplitInfo:
        """The split whose task specs the caller asks to read: 400 for an unknown one, 403 for a
        sealed one unless the caller holds a publish key of the team that owns the environment."""
        info = hints.split_named(env, split_name)  # unknown: 400 naming the valid ones
        if info.sealed and not hidden.owner_key(caller, env.team_id):
            raise GatewayError(403, hidden.sealed_reason(split_name, env.full_name))
        return info

    async def tasks_public(self, info: SplitInfo, start: int, stop: int) -> list:
        """Tasks [start, stop) of a split as clients may see them (hidden fields dropped)."""
        specs = await self.store.task_specs(info.id, start, stop)
        return [hidden.redact(spec, info.hidden) for spec in specs] if info.hidden else specs

    async def task_public(self, info: SplitInfo, index: int) -> Any:
        spec = await self.store.task_spec(info, index) if 0 <= index < info.num_tasks else None
        return None if spec is None else hidden.redact(spec, info.hidden)

    # --- opening an episode -------------------------------------------------------------------

    def open_session(self, caller: Caller, *, secrets: dict[str, str]) -> str:
        """A new session id; secrets given now are kept for the episode created on it."""
        sid = str(uuid.uuid4())
        if secrets and len(self.pending) < MAX_PENDING:
            self.pending[sid] = PendingSid(team_id=caller.team_id, secrets=secrets)
        return sid

    def _pending_secrets(self, caller: Caller, sid: str, secrets: dict[str, str]) -> dict[str, str]:
        # Kept until the session exists: a create refused (429, 503) and retried still has them.
        pending = self.pending.get(sid)
        if pending is not None and pending.team_id == caller.team_id:
            return {**pending.secrets, **secrets}
        return secrets

    async def _place(self, caller: Caller) -> str:
        try:
            return await self.executor.place(caller.team_slug)
        except NoRunnerAvailable:
            raise GatewayError(503, "No runner is available; retry shortly.", {"Retry-After": "5"}) from None

    async def create_episode(self, caller: Caller, *, sid: str, env: EnvHandle, task_spec: Any = None,
                             split: str | None = None, index: int | None = None,
                             secrets: dict[str, str] | None = None, protocol: str = "ors",
                             slot_taken: bool | None = None, runner: str | None = None,
                             run: str | None = None) -> LiveSession:
        """Create the episode (a task spec, or split + index) and start setup in the background;
        returns at once. Raises GatewayError (400 bad task, 429 at capacity, 503 no runner).
        `run` names the training run (X-Run, a `run` field); none means the API key's name."""
        if split is not None:
            task_spec = await self.task_spec(env, split, index)
        elif env.hides:
            split, index, task_spec = await self.task_rehydrate(env, task_spec)
        info = env.splits.get(split) if split else None
        # What is recorded (session pages, exports, analytics) is what the caller may see.
        public_spec = hidden.redact(task_spec, info.hidden) if info is not None else task_spec
        if sid in self.sessions or (sid in self.deferred and slot_taken is None):
            raise GatewayError(400, "Session already exists")
        secrets = secrets_admitted(caller, env, self._pending_secrets(caller, sid, secrets or {}))
        runner = runner or await self._place(caller)
        holds_slot = slot_taken if slot_taken is not None else await self.limits.acquire_session(
            caller.team_id, sid, caller.max_open_sessions)
        # `caller`: the API key. Its sessions share workers with no other key's, even of its own
        # team, so nothing one caller's code left running meets another's session (pool.py).
        owner = {"pk": None, "team": caller.team_id, "caller": caller.api_key_id, "version": env.version_id,
                 "env": f"{env.full_name}@{env.version_number}", "slot": holds_slot}
        spec = SessionSpec(sid=sid, package_path=env.package_path, entrypoint=env.entrypoint,
                           task_spec=task_spec, secrets=secrets, owner=owner)
        # An executor of this process needs nothing of the row: setup starts now and runs while
        # the row is written (the episode's first answer waits for the longer of the two, not
        # both). A shared one keeps the row's id with the session, so it starts after the write.
        early = not self.executor.shared
        if early:
            await self._start(caller, sid, spec, runner, None)
        run_name = run_name_for(caller, run)
        try:
            if run_name and caller.team_id is not None:
                await self.store.run_ensure(caller.team_id, run_name)
            pk = await self.store.session_create(
                sid=sid, caller=caller, env=env, task_spec=public_spec, split=split or "", index=index,
                runner=runner, protocol=protocol, sealed=info is not None and info.sealed, run_name=run_name,
            )
        except BaseException as exc:
            if early:
                await self.executor.stop(sid)
            await self.limits.release_session(caller.team_id, sid)
            if isinstance(exc, IntegrityError):
                raise GatewayError(400, "Session already exists") from None
            raise
        owner["pk"] = pk
        # What the live faces echo (OpenEnv's observation and state): a sealed split's spec only
        # to a publish key of its owners, like every other read of it (docs/hidden-tasks.md).
        echoed = public_spec if info is None or not info.sealed or hidden.owner_key(caller, env.team_id) else None
        live = LiveSession(sid=sid, pk=pk, team_id=caller.team_id, env=env, secrets=secret_values(secrets),
                           runner=runner, adopted_at=time.monotonic() if self.executor.shared else None,
                           holds_slot=holds_slot, protocol=protocol, task_public=echoed, split=split or "",
                           index=index)
        self.sessions[sid] = live
        if not early:
            await self._start(caller, sid, spec, runner, pk)
        self.pending.pop(sid, None)
        self.spawn(self._record_setup(live))
        return live

    async def _start(self, caller: Caller, sid: str, spec: SessionSpec, runner: str, pk: int | None) -> None:
        try:
            await self.executor.start(spec, runner)
        except Exception as exc:
            # The runner could not be reached: undo, so a retry of this create with the same id works.
            log.warning("could not start session %s on %s: %s", sid, runner, exc)
            self.sessions.pop(sid, None)
            await self.limits.release_session(caller.team_id, sid)
            if pk is not None:
                await self.store.session_discard(pk)
            raise GatewayError(503, "No runner could take the session; retry shortly.",
                               {"Retry-After": "2"}) from None

    async def defer_episode(self, caller: Caller, *, sid: str, task_spec: Any = None, split: str | None = None,
                            index: int | None = None, secrets: dict[str, str] | None = None,
                            protocol: str = "ors", run: str | None = None) -> None:
        """A create that names no environment: nothing is recorded or started until the session's
        first environment-scoped request names one (session()), or falls back to the default. The
        team's open-session slot is taken now, so capacity answers at create as usual."""
        if sid in self.sessions or sid in self.deferred:
            raise GatewayError(400, "Session already exists")
        if await self.store.sid_taken(sid):
            raise GatewayError(400, "Session already exists")
        runner = await self._place(caller)  # 503 now, as for any create, when no runner is live
        holds_slot = await self.limits.acquire_session(caller.team_id, sid, caller.max_open_sessions)
        self.deferred[sid] = DeferredEpisode(
            team_id=caller.team_id, task_spec=task_spec, split=split, index=index, protocol=protocol,
            holds_slot=holds_slot, runner=runner, secrets=self._pending_secrets(caller, sid, secrets or {}), run=run)
        self.pending.pop(sid, None)

    async def _bind(self, caller: Caller, sid: str, deferred: DeferredEpisode, named: str | None) -> LiveSession:
        env = await self.environment(caller, named) if named else None
        if env is None:
            if named:
                raise await self.unknown_environment(caller, named)
            env = await self.default_environment(caller)
            if env is None:
                raise GatewayError(404, "No environment named and no default environment is available.")
        try:
            live = await self.create_episode(
                caller, sid=sid, env=env, task_spec=deferred.task_spec, split=deferred.split,
                index=deferred.index, secrets=deferred.secrets, protocol=deferred.protocol,
                slot_taken=deferred.holds_slot, runner=deferred.runner, run=deferred.run)
        except GatewayError as exc:
            if exc.status == 503:
                deferred.runner = ""  # the runner chosen at create did not take it: choose again
            raise
        self.deferred.pop(sid, None)
        return live

    async def _record_setup(self, live: LiveSession) -> None:
        # A failure is written at once; readiness is coalesced into the activity flush (and the
        # session's end), which saves a write per episode.
        try:
            await self.executor.wait_ready(live.sid, float("inf"))
        except SetupFailed as exc:
            await self.store.session_mark_failed(live.pk, storable(redact(str(exc), live.secrets)))
            return
        except UnknownSession:
            return
        except Exception as exc:  # e.g. Redis went away; requests for the session report it themselves
            log.warning("could not follow the setup of session %s: %s", live.sid, exc)
            return
        live.ready_at = timezone.now()

    # --- a session's requests -----------------------------------------------------------------

    async def session(self, caller: Caller, sid: str, named: str | None = None) -> LiveSession:
        """The caller's open session, or the right GatewayError for it. `named` is the environment
        the request names, if any: a session whose create named none is bound to it now; otherwise
        naming another environment than the session's is an error (a client that started the
        session on another environment than it now addresses), not silently ignored."""
        deferred = self.deferred.get(sid)
        if deferred is not None and deferred.team_id == caller.team_id:
            # Concurrent first requests share one binding (the episode is created once).
            if deferred.binding is None or deferred.binding.done():
                deferred.binding = asyncio.ensure_future(self._bind(caller, sid, deferred, named))
            return await asyncio.shield(deferred.binding)
        live = await self._live_session(caller, sid)
        if named and ENV_REF_RE.match(named):
            env = await self.store.environment(caller, named)
            if env is not None and env.environment_id != live.env.environment_id:
                raise GatewayError(404, f"Session {live.sid} runs {live.env.full_name}, not {named}.")
        return live

    async def ping(self, caller: Caller, sid: str) -> None:
        deferred = self.deferred.get(sid)
        if deferred is not None and deferred.team_id == caller.team_id:
            deferred.created = time.monotonic()
            return
        await self._live_session(caller, sid)

    def live(self, caller: Caller, sid: str) -> LiveSession | None:
        """The caller's open session held by this gateway, without any lookup (None otherwise)."""
        live = self.sessions.get(sid)
        if live is not None and live.team_id == caller.team_id and not live.deleted:
            return live
        return None

    async def _live_session(self, caller: Caller, sid: str) -> LiveSession:
        live = self.sessions.get(sid)
        if live is not None and live.team_id == caller.team_id and live.adopted_at is not None and (
                time.monotonic() - live.adopted_at > settings.ORS_SESSION_CACHE_SECONDS):
            # Another gateway may have ended it since: read the row again (keeping this gateway's
            # unflushed activity if it is still open).
            row = await self.store.session_for(caller, sid)
            if row is not None and row.status in OPEN:
                live.adopted_at = time.monotonic()
            else:
                self._drop_copy(sid)
                if live.holds_slot:  # ended elsewhere (another gateway, the beat): free its slot now
                    await self.limits.release_session(live.team_id, sid)
                raise await self._gone_error(caller, sid)
        if live is None and self.executor.shared:
            live = await self._adopt(caller, sid)
        if live is not None and live.team_id == caller.team_id and not live.deleted:
            live.touch()
            return live
        raise await self._gone_error(caller, sid)

    async def _adopt(self, caller: Caller, sid: str) -> LiveSession | None:
        """A session created by another gateway, served here too (shared executors only): from
        the executor's record of it when there is one (no database read), else from its row."""
        record = await self.executor.shared_record(sid)
        if record is not None and record.get("pk") is not None:
            if record.get("team") != caller.team_id or record.get("state") not in ("starting", "ready"):
                return None  # another team's, or ended: the caller gets the row's answer
            pk, version_id, runner = record["pk"], record["version"], record["runner"]
            holds_slot = record.get("slot", True)
        else:
            row = await self.store.session_for(caller, sid)
            if row is None or row.status not in OPEN:
                return None
            pk, version_id, runner = row.pk, row.version_id, row.runner
            holds_slot = True  # not known here: releasing a slot never taken is harmless
        env = await self.store.version(version_id)
        if env is None:
            return None
        live = LiveSession(sid=sid, pk=pk, team_id=caller.team_id, env=env, runner=runner,
                           adopted_at=time.monotonic(), holds_slot=holds_slot)
        self.executor.attach(sid, runner)
        self.sessions[sid] = live
        return live

    def _drop_copy(self, sid: str) -> None:
        """Stop serving a shared session here (its instance and its row are left alone)."""
        self.sessions.pop(sid, None)
        self.executor.detach(sid)

    def _ended_elsewhere(self, sid: str) -> None:
        """A shared session ended through another gateway: this gateway's copy goes now, rather
        than being served until its cache time runs out and its activity written for a minute."""
        live = self.sessions.get(sid)
        if live is not None and not live.deleted:
            self._drop_copy(sid)

    async def _gone_error(self, caller: Caller, sid: str) -> GatewayError:
        row = await self.store.session_for(caller, sid)
        if row is None:
            return GatewayError(404, "Session not found.")
        if row.status == Session.Status.DELETED:
            return GatewayError(410, "Session was deleted.")
        if row.status == Session.Status.EXPIRED:
            minutes = settings.ORS_IDLE_TIMEOUT_SECONDS / 60
            return GatewayError(404, f"Session expired after {minutes:g} minutes without activity.")
        if row.status == Session.Status.FAILED:
            return GatewayError(500, f"Environment setup failed: {row.error}")
        # Open in the database but not held here: the process that held it is gone.
        return GatewayError(410, "Session lost: the runner that held it stopped.")

    async def ready(self, live: LiveSession, wait: float | None = None) -> None:
        """Wait (up to ORS_SETUP_WAIT_SECONDS) for setup: 503 while it runs, 500 when it failed."""
        if self.executor.ready_now(live.sid):
            return
        try:
            await self.executor.wait_ready(live.sid, settings.ORS_SETUP_WAIT_SECONDS if wait is None else wait)
        except SetupPending:
            raise GatewayError(503, "Environment is still starting; retry shortly.",
                               {"X-Backend-State": "starting", "Retry-After": "2"}) from None
        except SetupFailed as exc:
            raise GatewayError(500, f"Environment setup failed: {redact(str(exc), live.secrets)}") from None
        except UnknownSession as exc:
            raise instance_gone(exc) from None

    async def prompt(self, live: LiveSession) -> list[dict]:
        await self.ready(live)
        blocks = await self._ask(live, "get_prompt", self.executor.prompt(live.sid))
        if not live.prompt_recorded:
            # For the session explorer and exports; off the request's path (the answer does not wait).
            live.prompt_recorded = True
            audit = self.executor.prompt_audit(live.sid)
            # Written with the session's end (or the activity flush): no statement of its own. With
            # a shared executor another gateway may end the session; it writes the initial prompt
            # from the session's record (end_session), so the explorer has it either way.
            live.prompt_unwritten = storable(audit if audit is not None else redact(blocks, live.secrets))
        return blocks

    async def tools(self, live: LiveSession) -> list[dict]:
        """The session's tools: the environment's shared ones and the task's own."""
        await self.ready(live)
        return [*live.env.tools, *await self._ask(live, "list_task_tools", self.executor.task_tools(live.sid))]

    async def native_state(self, live: LiveSession) -> dict:
        """An OpenEnv environment's live state, asked of its instance (sessions.py: only for one
        whose answers do not carry it)."""
        await self.ready(live)
        state = await self._ask(live, "state", self.executor.native_state(live.sid))
        return state if isinstance(state, dict) else {}

    @staticmethod
    async def _ask(live: LiveSession, what: str, request: Awaitable[Any]) -> Any:
        """The instance's answer to `request`, its failures as the gateway's errors: gone (410), its
        runner unreachable (503), or the environment's own method (`what`) failing (500, redacted)."""
        try:
            return await request
        except UnknownSession as exc:
            raise instance_gone(exc) from None
        except RunnerUnavailable as exc:
            raise GatewayError(503, f"{exc}; retry shortly.", {"Retry-After": "5"}) from None
        except Exception as exc:
            raise GatewayError(500, redact(f"{what} failed: {type(exc).__name__}: {exc}", live.secrets)) from None

    async def start_call(self, caller: Caller, live: LiveSession, name: str, tool_input: dict, *,
                         lingers: bool = True) -> CallEntry:
        """Start a tool call and return at once; `entry.done` is set when its result is recorded.
        Raises GatewayError (429 over the team's call rate, setup errors)."""
        await self.limits.take_call_token(caller.team_id, caller.max_tool_calls_per_second)
        await self.ready(live)
        return self.calls.start(live, name, tool_input, lingers=lingers)

    async def call(self, caller: Caller, live: LiveSession, name: str, tool_input: dict) -> CallEntry:
        """A tool call, awaited (for faces that answer with the whole outcome). Nothing reconnects
        to it by task id, so it is not kept once finished: thousands of held sockets stepping every
        few seconds would otherwise keep a few hundred thousand finished entries in memory."""
        entry = await self.start_call(caller, live, name, tool_input, lingers=False)
        await entry.done.wait()
        return entry

    async def call_entry(self, live: LiveSession, task_id: str) -> CallEntry | None:
        """An earlier call of the session by its task id (a reconnect), wherever it ran."""
        return live.calls.get(task_id) or await self.calls.entry_from_audit(live, task_id)

    # --- ending an episode --------------------------------------------------------------------

    async def end_session(self, live: LiveSession, status: str) -> None:
        live.deleted = True  # no new request for it from here on
        # With a shared executor other gateways may have served calls: totals come from the audit log.
        totals = None if self.executor.shared else live.totals()
        prompt = live.prompt_unwritten
        if prompt is None and self.executor.shared:
            # The initial prompt as the runner recorded it at setup (kept only where none is yet);
            # it is for the explorer only, so a record that cannot be read ends the session without it.
            try:
                recorded = await self.executor.recorded_prompt(live.sid)
            except Exception as exc:
                log.warning("could not read the recorded prompt of session %s: %s", live.sid, exc)
                recorded = None
            prompt = storable(recorded) if recorded is not None else None
        try:
            # The row first: while the database is down the request fails (503) and the session is
            # left as it was (instance included), so the client's retried delete finds it intact.
            await self.store.session_end(live.pk, status, live.last_activity_at(), totals, live.ready_at, prompt)
        except BaseException:
            live.deleted = False
            raise
        self.sessions.pop(live.sid, None)
        if live.holds_slot:
            await self.limits.release_session(live.team_id, live.sid)
        await self.executor.stop(live.sid)

    async def _drop_deferred(self, caller: Caller, sid: str) -> bool:
        deferred = self.deferred.get(sid)
        if deferred is None or deferred.team_id != caller.team_id:
            return False
        self.deferred.pop(sid, None)
        if deferred.holds_slot:
            await self.limits.release_session(caller.team_id, sid)
        return True

    async def end(self, caller: Caller, sid: str) -> None:
        """End the caller's episode (teardown included). Ending twice, or an episode that already
        ended, is not an error; an unknown (or another team's) sid is 404."""
        if await self._drop_deferred(caller, sid):
            return
        live = self.sessions.get(sid)
        if live is None and self.executor.shared:
            # Created through another gateway: end it here, teardown on its runner included.
            live = await self._adopt(caller, sid)
        if live is not None and live.team_id == caller.team_id:
            await self.end_session(live, Session.Status.DELETED)
            return
        row = await self.store.session_for(caller, sid)
        if row is None:
            raise GatewayError(404, "Session not found.")
        if row.status in (*OPEN, Session.Status.FAILED):
            await self.store.session_end(row.pk, Session.Status.DELETED)

    async def discard(self, caller: Caller, sid: str) -> None:
        """Drop a session id and whatever this gateway holds for it (a no-op for ids it does not
        know, another team's included: clients discard throwaway ids that never reached create)."""
        pending = self.pending.get(sid)
        if pending is not None and pending.team_id == caller.team_id:
            self.pending.pop(sid, None)
        if await self._drop_deferred(caller, sid):
            return
        live = self.sessions.get(sid)
        if live is not None and live.team_id == caller.team_id:
            await self.end_session(live, Session.Status.DELETED)
