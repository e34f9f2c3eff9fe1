"""Session lifecycle endpoints: create_session, create, ping, prompt, task_tools, delete."""

from __future__ import annotations

from typing import Any

from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.ors.http import SSE_HEADERS, HttpError, Request, sse_event
from orsplatform.ors.resolve import admit_sid, admitted_session, default_environment, named_environment
from orsplatform.ors.wire import (
    optional_int,
    optional_str,
    refuse_env_vars,
    require_sid,
    secrets_from_body,
    secrets_from_header,
)
from orsplatform.runs.naming import RUN_HEADER, BadRunName, run_name_clean
from orsplatform.teams.auth import Caller


async def create_session(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    body = req.json(required=False)
    refuse_env_vars(body)
    sid = gw.open_session(caller, secrets=secrets_from_header(req))
    if not req.accepts_sse():
        return {"sid": sid}
    # Both official clients parse only SSE here (and retry forever on JSON).
    req.started = True
    await req.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await req.send({"type": "http.response.body", "body": sse_event("task_id", sid) + sse_event("end", "")})
    return None


async def create(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    body = req.json(required=False)
    env_name = optional_str(body, "env_name")
    optional_str(body, "toolset_name")
    task_spec = body.get("task_spec")
    split = optional_str(body, "split")
    index = optional_int(body, "index")
    has_spec = task_spec is not None
    has_index = split is not None and index is not None
    if (split is None) != (index is None):
        raise HttpError(400, "'split' and 'index' must be given together")
    if has_spec == has_index:
        raise HttpError(400, "Provide either task_spec or both split and index, not both/neither")
    if has_spec and not isinstance(task_spec, dict):
        raise HttpError(400, "'task_spec' must be a JSON object")
    if has_index and index < 0:
        raise HttpError(400, f"Invalid index {index}: task indices start at 0.")
    secrets = secrets_from_header(req)
    secrets.update(secrets_from_body(body))
    try:
        # The body's `run` wins over the X-Run header; neither means the API key's name.
        run = run_name_clean(body.get("run")) or run_name_clean(req.header(RUN_HEADER.encode()))
    except BadRunName as exc:
        raise HttpError(400, str(exc)) from None

    env = await named_environment(gw, req, caller, env_ref, body_env=env_name)
    if env is None and caller.environment_id is None:
        # ors.client's split+index sessions name their environment only in the paths of later
        # requests: the episode starts on the environment the first of them names.
        await gw.defer_episode(caller, sid=sid, task_spec=task_spec, split=split, index=index, secrets=secrets,
                               run=run)
        return {"sid": sid}
    if env is None:
        env = await default_environment(gw, caller)  # the key's bound environment
    await gw.create_episode(caller, sid=sid, env=env, task_spec=task_spec, split=split, index=index,
                            secrets=secrets, run=run)
    return {"sid": sid}


async def ping(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    await admit_sid(gw, caller, sid)
    await gw.ping(caller, sid)
    return {"status": "ok"}


async def prompt(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    live = admitted_session(caller, await gw.session(caller, require_sid(req), env_ref))
    return await gw.prompt(live)


async def task_tools(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    live = admitted_session(caller, await gw.session(caller, require_sid(req), env_ref))
    return {"tools": await gw.tools(live)}


async def delete(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    await admit_sid(gw, caller, sid)
    await gw.end(caller, sid)
    return {"sid": sid}


async def delete_session(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    sid = require_sid(req)
    await gw.discard(caller, sid)
    return {"sid": sid}
