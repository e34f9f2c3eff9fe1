"""API-key authentication shared by the ORS surface and the REST API.

Keys look like ``ors_<prefix>_<secret>``. The prefix is indexed; the secret is compared by hash
in constant time. Verified keys are cached in-process for a couple of seconds so the hot path
does not hit the database on every request; ``last_used_at`` is coalesced and flushed in bulk.
"""

from __future__ import annotations

import hmac
import re
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import hash_secret

TOKEN_RE = re.compile(r"^ors_([0-9a-f]{8})_([0-9a-f]{32})$")


class AuthError(Exception):
    """Raised for a key that is malformed, unknown, revoked or expired (all answer 401)."""


@dataclass(frozen=True)
class Caller:
    """Who is calling: a team through an API key, or anonymous (team_id None)."""

    team_id: int | None
    team_slug: str | None = None
    api_key_id: int | None = None
    scopes: frozenset[str] = frozenset()
    environment_id: int | None = None  # the key's bound environment, if any
    # The team's limits (None: unlimited), refreshed with the key cache.
    max_open_sessions: int | None = None
    max_tool_calls_per_second: int | None = None

    @property
    def is_anonymous(self) -> bool:
        return self.team_id is None

    def can(self, scope: str) -> bool:
        return scope in self.scopes


ANONYMOUS = Caller(team_id=None)


def extract_token(headers: dict[bytes, bytes]) -> str | None:
    """The key from ``X-API-Key`` or ``Authorization: Bearer``; None when neither is sent."""
    raw = headers.get(b"x-api-key")
    if raw is None:
        auth = headers.get(b"authorization")
        if auth is None:
            return None
        scheme, _, value = auth.decode("latin-1").strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthError("Authorization header must be 'Bearer <key>'.")
        return value.strip()
    return raw.decode("latin-1").strip()


class KeyCache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Caller, datetime | None]] = {}
        self._last_used: dict[int, datetime] = {}

    def get(self, token: str) -> Caller | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        cached_at, caller, expires_at = entry
        if time.monotonic() - cached_at > settings.ORS_AUTH_CACHE_SECONDS:
            self._entries.pop(token, None)
            return None
        if expires_at is not None and expires_at <= timezone.now():
            self._entries.pop(token, None)
            return None
        return caller

    def put(self, token: str, caller: Caller, expires_at: datetime | None) -> None:
        if len(self._entries) > 100_000:
            self._entries.clear()
        self._entries[token] = (time.monotonic(), caller, expires_at)

    def note_use(self, caller: Caller) -> None:
        if caller.api_key_id is not None:
            self._last_used[caller.api_key_id] = timezone.now()

    def drain_last_used(self) -> dict[int, datetime]:
        drained, self._last_used = self._last_used, {}
        return drained

    def clear(self) -> None:
        self._entries.clear()


key_cache = KeyCache()


def verify_token(token: str) -> tuple[Caller, datetime | None]:
    """Look a key up in the database (sync). Raises AuthError."""
    match = TOKEN_RE.match(token)
    if match is None:
        raise AuthError("Malformed API key.")
    prefix, secret = match.groups()
    key = ApiKey.objects.select_related("team").filter(prefix=prefix).first()
    # Hash and compare even when the prefix is unknown so timing does not tell prefixes apart.
    expected = key.secret_hash if key is not None else "0" * 64
    if not hmac.compare_digest(hash_secret(secret), expected) or key is None:
        raise AuthError("Invalid API key.")
    if key.revoked_at is not None:
        raise AuthError("API key has been revoked.")
    if key.expires_at is not None and key.expires_at <= timezone.now():
        raise AuthError("API key has expired.")
    caller = Caller(
        team_id=key.team_id, team_slug=key.team.slug, api_key_id=key.id,
        scopes=frozenset(key.scopes or []), environment_id=key.environment_id,
        max_open_sessions=key.team.max_open_sessions, max_tool_calls_per_second=key.team.max_tool_calls_per_second,
    )
    return caller, key.expires_at


def authenticate_token_sync(token: str) -> Caller:
    caller = key_cache.get(token)
    if caller is None:
        caller, expires_at = verify_token(token)
        key_cache.put(token, caller, expires_at)
    key_cache.note_use(caller)
    return caller
