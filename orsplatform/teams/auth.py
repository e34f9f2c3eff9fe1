"""Who may do what: API-key authentication and the one access policy, shared by every face
(the ORS app, the REST API, the OpenEnv consumer).

Keys look like ``ors_<prefix>_<secret>``. The prefix is indexed; the secret is compared by hash
in constant time. Verified keys are cached in-process for a couple of seconds so the hot path
does not hit the database on every request; ``last_used_at`` is coalesced and flushed in bulk.
``authorize`` (and ``authorize_async`` for event loops) is the only place that decides whether a
request without a key, or with a key lacking a scope, may go on; ``admit_environment`` decides
whether a key bound to one environment may use another (never); ``recheck_async`` looks a key up
again past the cache, for connections that outlive a request (OpenEnv sockets).
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from django.conf import settings
from django.utils import timezone

from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import hash_secret

TOKEN_RE = re.compile(r"^ors_([0-9a-f]{8})_([0-9a-f]{32})$")


KEY_REQUIRED = "An API key is required (X-API-Key or Authorization: Bearer)."


class AuthError(Exception):
    """A key that is malformed, unknown, revoked or expired, or none where one is needed (401)."""

    status = 401


class AccessDenied(AuthError):
    """A valid key without the scope the request needs (403)."""

    status = 403


class Access(Enum):
    """What a request needs. OPEN: nothing (health). CATALOG: any key, or none when
    ORS_ANONYMOUS_CATALOG allows it. SESSIONS: a key with the sessions scope, or none when
    ORS_ANONYMOUS_SESSIONS allows it. TEAM (a team's own data: its sessions, audit log, analytics):
    a key with the sessions scope, never anonymous. PUBLISH: a key with the publish scope. MANAGE
    (the team's configuration: registering and removing AAP agents): a key with the manage scope.
    KEY: any valid key of the team, never anonymous (its own ingest jobs)."""

    OPEN = "open"
    KEY = "key"
    CATALOG = "catalog"
    SESSIONS = "sessions"
    TEAM = "team"
    PUBLISH = "publish"
    MANAGE = "manage"


# access -> the scope its key must carry; the setting that lets a request without a key through.
_SCOPE = {Access.SESSIONS: "sessions", Access.TEAM: "sessions", Access.PUBLISH: "publish",
          Access.MANAGE: "manage"}
_ANONYMOUS_SETTING = {Access.CATALOG: "ORS_ANONYMOUS_CATALOG", Access.SESSIONS: "ORS_ANONYMOUS_SESSIONS"}


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
    # The key's name: the run an episode belongs to when the client names none (docs/runs.md).
    api_key_name: str = ""

    @property
    def is_anonymous(self) -> bool:
        return self.team_id is None

    def can(self, scope: str) -> bool:
        return scope in self.scopes

    def may_use(self, environment_id: int) -> bool:
        """A key bound to one environment uses that one only (its catalog, its sessions)."""
        return self.environment_id is None or self.environment_id == environment_id


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

    def forget(self, token: str) -> None:
        self._entries.pop(token, None)

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
        api_key_name=key.name,
    )
    return caller, key.expires_at


def admit(caller: Caller | None, access: Access) -> Caller:
    """The access policy: the caller a request runs as (ANONYMOUS without a key), or AuthError /
    AccessDenied. `caller` is the key's caller, None when no key was sent."""
    if access is Access.OPEN:
        return ANONYMOUS
    if caller is None:
        setting = _ANONYMOUS_SETTING.get(access)
        if setting is None or not getattr(settings, setting):
            raise AuthError(KEY_REQUIRED)
        return ANONYMOUS
    scope = _SCOPE.get(access)
    if scope is not None and not caller.can(scope):
        raise AccessDenied(f"This API key lacks the '{scope}' scope.")
    return caller


def admit_environment(caller: Caller, environment_id: int, name: str) -> None:
    """A key bound to one environment may not use another: AccessDenied (403), whatever the other
    is (builtin/math, the default for clients that name none, included)."""
    if not caller.may_use(environment_id):
        raise AccessDenied(f"This API key is bound to one environment; it may not use {name}.")


def _cached(token: str) -> Caller | None:
    caller = key_cache.get(token)
    if caller is not None:
        key_cache.note_use(caller)
    return caller


def _remember(token: str, verified: tuple[Caller, datetime | None]) -> Caller:
    caller, expires_at = verified
    key_cache.put(token, caller, expires_at)
    key_cache.note_use(caller)
    return caller


def identify(token: str) -> Caller:
    """The caller behind a key (the key cache, else the database). Raises AuthError."""
    return _cached(token) or _remember(token, verify_token(token))


# Lookups in flight, by token: when a key's cache entry expires, every request of that key that
# arrives before the lookup returns waits for that one lookup (at concurrency 16 each expiry sent
# 16 identical queries to the one SQLite thread, behind the episode writes).
_lookups: dict[str, asyncio.Future] = {}


async def identify_async(token: str, run: Callable[..., Awaitable]) -> Caller:
    """identify() for an event loop: a cache miss is looked up through `run(fn, token)` (a DB thread)."""
    caller = _cached(token)
    if caller is not None:
        return caller
    lookup = _lookups.get(token)
    if lookup is None or lookup.get_loop() is not asyncio.get_running_loop():
        lookup = _lookups[token] = asyncio.ensure_future(run(verify_token, token))
        lookup.add_done_callback(lambda done: _lookups.pop(token, None) if _lookups.get(token) is done else None)
    return _remember(token, await asyncio.shield(lookup))


def authorize(token: str | None, access: Access) -> Caller:
    """Who a request runs as, from its key (None: no key sent) and what it needs."""
    if access is Access.OPEN:
        return ANONYMOUS
    return admit(identify(token) if token is not None else None, access)


async def authorize_async(token: str | None, access: Access, run: Callable[..., Awaitable]) -> Caller:
    if access is Access.OPEN:
        return ANONYMOUS
    return admit(await identify_async(token, run) if token is not None else None, access)


async def recheck_async(token: str, access: Access, run: Callable[..., Awaitable]) -> Caller:
    """The key looked up in the database again, past the cache (for a connection opened with it
    that is still open): its caller, or AuthError / AccessDenied once it was revoked, expired or
    lost the scope. The cache is refreshed (or the key forgotten), so requests agree with it."""
    try:
        caller = _remember(token, await run(verify_token, token))
    except AuthError:
        key_cache.forget(token)
        raise
    return admit(caller, access)
