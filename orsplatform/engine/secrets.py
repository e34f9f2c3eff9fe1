"""Which of a caller's secrets an environment receives.

A team's secrets are its own: its own environments (and those of the teams the operator trusts
with any secret, ORS_SECRETS_TRUSTED_TEAMS: by default the builtin team, whose environments the
operator publishes) receive whatever the caller sends. Another team's environment receives only
the secrets its manifest declares in ``required_secrets``: the caller can see that list before
sending anything, and a /create that sends other secrets is refused, naming them, rather than
handing a secret to code whose author never said it wanted it.
"""

from __future__ import annotations

from django.conf import settings

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.engine.errors import GatewayError
from orsplatform.teams.auth import Caller

# The openreward client adds the caller's platform API key under these names to every session it
# opens. The caller did not choose to send it, and it is a platform credential: another team's
# environment never gets it (declared or not), and is not refused for it either (refusing would
# make that client unusable with every other team's environment).
CLIENT_ADDED = frozenset({"api_key", "OPENREWARD_API_KEY"})
PLATFORM_KEY_PREFIX = "ors_"


def _platform_key(name: str, value: str) -> bool:
    return name in CLIENT_ADDED and value.startswith(PLATFORM_KEY_PREFIX)


def secrets_admitted(caller: Caller, env: EnvHandle, secrets: dict[str, str]) -> dict[str, str]:
    """The secrets `env` receives of those `caller` sent; GatewayError 400 naming the ones it may
    not receive."""
    if not secrets or env.team_id == caller.team_id or env.team_slug in settings.ORS_SECRETS_TRUSTED_TEAMS:
        return secrets
    declared = env.required_secrets
    sent = {name: value for name, value in secrets.items() if not _platform_key(name, value)}
    refused = sorted(name for name in sent if name not in declared)
    if refused:
        listed = ", ".join(sorted(declared)) or "none"
        raise GatewayError(400, f"Environment {env.full_name} does not declare the secrets "
                                f"{', '.join(refused)} in its required_secrets (it declares: {listed}); "
                                "another team's environment receives only the secrets it declares. "
                                "Nothing was sent to it.")
    return sent
