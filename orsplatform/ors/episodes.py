"""Session lifecycle endpoints: create_session, create, ping, prompt, task_tools, delete."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError
from django.utils import timezone

from orsplatform.episodes.models import Session
from orsplatform.ors.calls import storable
from orsplatform.ors.http import SSE_HEADERS, HttpError, Request, sse_event
from orsplatform.ors.sessions import LiveSession, PendingSid, instance_gone
from orsplatform.ors.wire import (
    env_vars_from_body,
    optional_int,
    optional_str,
    require_sid,
    secrets_from_body,
    secrets_from_header,
)
from orsplatform.runners.executor import RunnerUnavailable, SessionSpec, SetupFailed, UnknownSession
from orsplatform.runners.redact import redact, secret_values
from orsplatform.teams.auth import Caller

if TYPE_CHECKING:
    from orsplatform.ors.app import OrsApp

log = logging.getLogger("orsplatform.ors")
MAX_PENDING = 200_000


async def create_session(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    body = req.json(required=False)
    pending = PendingSid(team_id=caller.team_id, secrets=secrets_from_header(req), env_vars=env_vars_from_body(body))
    sid = str(uuid.uuid4())
    if (pending.secrets or pending.env_vars) and len(app.pending) < MAX_PENDING:
        app.pending[sid] = pending
    if not req.accepts_sse():
        return {"sid": sid}
    # Both official clients parse only SSE here (and retry forever on JSON).
    req.started = True
    await req.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await req.send({"type": "http.response.body", "body": sse_event("task_id", sid) + sse_event("end", "")})
    return None


async def create(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    body = req.json(required=False)
    env_name = optional_str(body, "env_name")
    optional_str(body, "toolset_name")
    task_spec = body.get("task_spec")
    split_name = optional_str(body, "split")
    index = optional_int(body, "index")
    has_spec = task_spec is not None
    has_index = split_name is not None and index is not None
    if (split_name is None) != (index is None):
        raise HttpError(400, "'split' and 'index' must be given together")
    if has_spec == has_index:
        raise HttpError(400, "Provide either task_spec or both split and index, not both/neither")
    if has_spec and not isinstance(task_spec, dict):
        raise HttpError(400, "'task_spec' must be a JSON object")
    secrets = secrets_from_header(req)
    secrets.update(secrets_from_body(body))

    env = await app.environment_for(req, caller, env_ref, body_env=env_name)
    if has_index:
        split = env.splits.get(split_name)
        if split is None:
            raise HttpError(400, "Invalid split")
        if not 0 <= index < split.num_tasks:
            raise HttpError(400, "Invalid index")
        task_spec = await app.store.task_spec(split, index)
        if task_spec is None:
            raise HttpError(400, "Invalid index")
    if sid in app.sessions:
        raise HttpError(400, "Session already exists")

    # Kept until the session exists: a /create refused (429, 503) and retried still has them.
    pending = app.pending.get(sid)
    if pending is not None and pending.team_id == caller.team_id:
        secrets = {**pending.secrets, **secrets}
    runner = await app.place_session(caller)
    holds_slot = await app.limits.acquire_session(caller.team_id, sid, caller.max_open_sessions)
    try:
        pk = await app.store.session_create(
            sid=sid, caller=caller, env=env, task_spec=task_spec, split=split_name or "", index=index,
            runner=runner,
        )
    except BaseException as exc:
        await app.limits.release_session(caller.team_id, sid)
        if isinstance(exc, IntegrityError):
            raise HttpError(400, "Session already exists") from None
        raise
    live = LiveSession(sid=sid, pk=pk, team_id=caller.team_id, env=env, secrets=secret_values(secrets),
                       runner=runner, adopted_at=time.monotonic() if app.executor.shared else None,
                       holds_slot=holds_slot)
    app.sessions[sid] = live
    try:
        await app.executor.start(SessionSpec(
            sid=sid, package_path=env.package_path, entrypoint=env.entrypoint, task_spec=task_spec,
            secrets=secrets, owner={"pk": pk, "team": caller.team_id, "version": env.version_id,
                                    "env": f"{env.full_name}@{env.version_number}",
                                    "slot": holds_slot}), runner)
    except Exception as exc:
        # The runner could not be reached: undo, so a retry of this /create with the same id works.
        log.warning("could not start session %s on %s: %s", sid, runner, exc)
        app.sessions.pop(sid, None)
        await app.limits.release_session(caller.team_id, sid)
        await app.store.session_discard(pk)
        raise HttpError(503, "No runner could take the session; retry shortly.", {"Retry-After": "2"}) from None
    app.pending.pop(sid, None)
    app.spawn(_record_setup(app, live))
    return {"sid": sid}


async def _record_setup(app: OrsApp, live: LiveSession) -> None:
    # A failure is written at once; readiness is coalesced into the activity flush (and the
    # session's end), which saves a write per episode.
    try:
        await app.executor.wait_ready(live.sid, float("inf"))
    except SetupFailed as exc:
        await app.store.session_mark_failed(live.pk, str(exc))
        return
    except UnknownSession:
        return
    except Exception as exc:  # e.g. Redis went away; requests for the session report it themselves
        log.warning("could not follow the setup of session %s: %s", live.sid, exc)
        return
    live.ready_at = timezone.now()


async def ping(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    await app.live_session(req, caller)
    return {"status": "ok"}


async def prompt(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    live = await app.live_session(req, caller, env_ref)
    await app.ready(live)
    try:
        blocks = await app.executor.prompt(live.sid)
    except UnknownSession as exc:
        raise instance_gone(exc) from None
    except RunnerUnavailable as exc:
        raise HttpError(503, f"{exc}; retry shortly.", {"Retry-After": "5"}) from None
    except Exception as exc:  # the environment's get_prompt() failed
        raise HttpError(500, f"get_prompt failed: {type(exc).__name__}: {exc}") from None
    if not live.prompt_recorded:
        # For the session explorer and exports; off the request's path (the answer does not wait).
        live.prompt_recorded = True
        audit = app.executor.prompt_audit(live.sid)
        app.spawn(_record_prompt(app, live.pk, storable(audit if audit is not None else redact(blocks, live.secrets))))
    return blocks


async def _record_prompt(app: OrsApp, pk: int, blocks: list[dict]) -> None:
    try:
        await app.store.session_record_prompt(pk, blocks)
    except Exception as exc:
        log.warning("could not record the prompt of session %s: %s", pk, exc)


async def task_tools(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    live = await app.live_session(req, caller, env_ref)
    await app.ready(live)
    try:
        return {"tools": [*live.env.tools, *await app.executor.task_tools(live.sid)]}
    except UnknownSession as exc:
        raise instance_gone(exc) from None
    except RunnerUnavailable as exc:
        raise HttpError(503, f"{exc}; retry shortly.", {"Retry-After": "5"}) from None
    except Exception as exc:
        raise HttpError(500, f"list_task_tools failed: {type(exc).__name__}: {exc}") from None


async def _end(app: OrsApp, live: LiveSession) -> None:
    await app.end_session(live, Session.Status.DELETED)


async def delete(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    live = app.sessions.get(sid)
    if live is None and app.executor.shared:
        # Created through another gateway: end it here, teardown on its runner included.
        live = await app.adopt(caller, sid)
    if live is not None and live.team_id == caller.team_id:
        await _end(app, live)
        return {"sid": sid}
    row = await app.store.session_for(caller, sid)
    if row is None:
        raise HttpError(404, "Session not found.")
    if row.status in (Session.Status.CREATING, Session.Status.READY, Session.Status.FAILED):
        await app.store.session_end(row.pk, Session.Status.DELETED)
    # Deleting twice (or after expiry) is not an error: teardown already happened.
    return {"sid": sid}


async def delete_session(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    pending = app.pending.get(sid)
    if pending is not None and pending.team_id == caller.team_id:
        app.pending.pop(sid, None)
    live = app.sessions.get(sid)
    if live is not None and live.team_id == caller.team_id:
        await _end(app, live)
    # Clients call this for throwaway ids that never reached /create, so an unknown (or another
    # team's, indistinguishably) id is a 200 no-op.
    return {"sid": sid}
