"""Which environment an ORS request names (docs/design.md §4), in order: the X-Deployment header, the
path, the /create body's env_name, a per-environment host name; then, for a caller that names none,
the key's bound environment and ORS_DEFAULT_ENVIRONMENT. A key bound to one environment uses that
one only: any other it names (or the default it would fall back to) answers 403."""

from __future__ import annotations

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.engine.errors import GatewayError
from orsplatform.engine.gateway import ENV_REF_RE, EpisodeGateway
from orsplatform.engine.live import LiveSession
from orsplatform.ors.http import HttpError, Request
from orsplatform.teams.auth import AccessDenied, Caller, admit_environment


def admitted(caller: Caller, env: EnvHandle) -> EnvHandle:
    """`env`, when the caller's key may use it (403 for a key bound to another)."""
    try:
        admit_environment(caller, env.environment_id, env.full_name)
    except AccessDenied as exc:
        raise HttpError(403, str(exc)) from None
    return env


def admitted_session(caller: Caller, live: LiveSession) -> LiveSession:
    """A session of the caller's team, when the caller's key may use its environment (403 else)."""
    admitted(caller, live.env)
    return live


async def admit_sid(gw: EpisodeGateway, caller: Caller, sid: str) -> None:
    """For requests that name a session but need not hold it (ping, delete): 403 for a bound key
    and a session of another environment. Keys without a binding pay nothing; a bound key's
    session held by another gateway (shared executors) is looked up, so that no gateway lets a
    bound key ping or end another environment's session."""
    if caller.environment_id is None:
        return
    live = gw.live(caller, sid)
    if live is None and gw.executor.shared and sid not in gw.deferred:
        try:
            live = await gw.session(caller, sid)
        except GatewayError:
            return  # gone or not the caller's: the request itself answers for that
    if live is not None:
        admitted_session(caller, live)


def host_env(req: Request) -> str | None:
    """A per-environment host name: `wordle.ors.example.com` names `wordle`, and
    `acme--maze.ors.example.com` names `acme/maze` (for clients that cannot name the environment)."""
    host = (req.header(b"host") or "").split(":", 1)[0]
    labels = host.split(".")
    if len(labels) < 3 or labels[0].isdigit():
        return None
    return labels[0].replace("--", "/", 1)


async def named_environment(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None,
                            body_env: str | None = None) -> EnvHandle | None:
    """The environment the request itself names (None when it names none); 404 for a name that
    resolves to nothing the caller may use."""
    deployment = (req.header(b"x-deployment") or "").strip()
    if deployment:
        env = await gw.environment(caller, deployment)
        if env is None:
            raise await gw.unknown_environment(caller, deployment, deployment=True)
        return admitted(caller, env)
    host_ref = host_env(req)
    if not env_ref and not body_env and host_ref and ENV_REF_RE.match(host_ref):
        env = await gw.environment(caller, host_ref)
        # A host name that names no environment (or none this key may use) is just a host name.
        if env is not None and caller.may_use(env.environment_id):
            return env
    for ref in (env_ref, body_env):
        if ref:
            env = await gw.environment(caller, ref)
            if env is None:
                raise await gw.unknown_environment(caller, ref)
            return admitted(caller, env)
    return None


async def default_environment(gw: EpisodeGateway, caller: Caller) -> EnvHandle:
    """For a request that names none: the key's bound environment, else ORS_DEFAULT_ENVIRONMENT
    (never that one for a bound key whose environment is gone: 403)."""
    env = await gw.default_environment(caller)
    if env is None:
        raise HttpError(404, "No environment named and no default environment is available.")
    return admitted(caller, env)


async def environment_for(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None,
                          body_env: str | None = None) -> EnvHandle:
    """The environment a catalog request addresses: the one it names, else the caller's default."""
    env = await named_environment(gw, req, caller, env_ref, body_env)
    return env if env is not None else await default_environment(gw, caller)

