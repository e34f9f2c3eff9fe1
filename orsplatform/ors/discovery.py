"""Discovery endpoints. They answer from what publishing stored; tenant code is never imported."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import ors
from django.conf import settings

from orsplatform import __version__
from orsplatform.catalog.selectors import EnvHandle, SplitInfo
from orsplatform.engine import hints
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.ors.http import HttpError, Request
from orsplatform.ors.resolve import environment_for
from orsplatform.ors.wire import optional_int, require_int, require_str
from orsplatform.teams.auth import Caller


async def health(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    return {"status": "ok"}


def _sdk_versions() -> dict[str, str | None]:
    """The SDKs environments may be written against, as installed (the platform speaks both)."""
    versions: dict[str, str | None] = {}
    for dist in ("ors-sdk", "openreward"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


SDK_VERSIONS = _sdk_versions()


async def version(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    info: dict[str, Any] = {"platform": __version__, "ors_sdk": ors.__version__, "sdks": SDK_VERSIONS,
                            "environment": None}
    sid = req.header(b"x-session-id")
    live = gw.live(caller, sid.strip()) if sid else None
    if live is not None:
        info["environment"] = f"{live.env.full_name}@{live.env.version_number}"
    return info


async def list_environments(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    if caller.environment_id is not None:  # a bound key sees the one environment it may use
        env = await gw.store.environment_by_id(caller, caller.environment_id)
        return [env.full_name] if env is not None else []
    return await gw.store.environments_visible(caller)


async def tools(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    env = await environment_for(gw, req, caller, env_ref)
    return {"tools": env.tools}


async def splits(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    env = await environment_for(gw, req, caller, env_ref)
    return [{"name": name, "type": env.splits[name].type} for name in env.split_order]


def _split(env: EnvHandle, body: dict) -> SplitInfo:
    return hints.split_named(env, require_str(body, "split"))


def _readable(gw: EpisodeGateway, caller: Caller, env: EnvHandle, body: dict) -> SplitInfo:
    """The split whose specs are read: sealed ones only by the owner's publish keys (403)."""
    return gw.task_reader(caller, env, require_str(body, "split"))


def _env_name(req: Request, env: EnvHandle, env_ref: str | None) -> str:
    # Echo the name the client used: the ors client sends it back as /create's env_name.
    return env_ref or (req.header(b"x-deployment") or "").strip() or env.full_name


async def tasks(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    env = await environment_for(gw, req, caller, env_ref)
    split = _readable(gw, caller, env, req.json())
    if split.num_tasks > settings.ORS_MAX_LIST_TASKS:
        raise HttpError(400, f"Split has {split.num_tasks} tasks; page through it with task_range.")
    specs = await gw.tasks_public(split, 0, split.num_tasks)
    return {"tasks": specs, "env_name": _env_name(req, env, env_ref)}


async def num_tasks(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    env = await environment_for(gw, req, caller, env_ref)
    return {"num_tasks": _split(env, req.json()).num_tasks}


async def task(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    env = await environment_for(gw, req, caller, env_ref)
    body = req.json()
    split = _readable(gw, caller, env, body)
    index = require_int(body, "index")
    if not 0 <= index < split.num_tasks:
        raise hints.index_out_of_range(split, index)
    spec = await gw.task_public(split, index)
    if spec is None:
        raise hints.index_out_of_range(split, index)
    return {"task": spec, "env_name": _env_name(req, env, env_ref)}


async def task_range(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    env = await environment_for(gw, req, caller, env_ref)
    body = req.json()
    split = _readable(gw, caller, env, body)
    # Python slice semantics, as in the reference server: negatives count from the end, clamp.
    start, stop, _ = slice(optional_int(body, "start"), optional_int(body, "stop")).indices(split.num_tasks)
    if stop - start > settings.ORS_MAX_LIST_TASKS:
        raise HttpError(400, f"Range too large; at most {settings.ORS_MAX_LIST_TASKS} tasks per request.")
    specs = await gw.tasks_public(split, start, stop) if stop > start else []
    return {"tasks": specs, "env_name": _env_name(req, env, env_ref)}
