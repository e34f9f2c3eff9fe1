"""Which environment an ORS request names (DESIGN.md §4), in order: the X-Deployment header, the
path, the /create body's env_name, a per-environment host name; then, for a caller that names none,
the key's bound environment and ORS_DEFAULT_ENVIRONMENT."""

from __future__ import annotations

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.gateway.gateway import ENV_REF_RE, EpisodeGateway
from orsplatform.ors.http import HttpError, Request
from orsplatform.teams.auth import Caller


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
            raise HttpError(404, "Deployment not found.")
        return env
    host_ref = host_env(req)
    if not env_ref and not body_env and host_ref and ENV_REF_RE.match(host_ref):
        env = await gw.environment(caller, host_ref)
        if env is not None:  # a host name that names no environment is just a host name
            return env
    for ref in (env_ref, body_env):
        if ref:
            env = await gw.environment(caller, ref)
            if env is None:
                raise HttpError(404, f"Environment {ref!r} not found.")
            return env
    return None


async def environment_for(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None,
                          body_env: str | None = None) -> EnvHandle:
    """The environment a catalog request addresses: the one it names, else the caller's default."""
    env = await named_environment(gw, req, caller, env_ref, body_env)
    if env is None:
        env = await gw.default_environment(caller)
    if env is None:
        raise HttpError(404, "No environment named and no default environment is available.")
    return env

