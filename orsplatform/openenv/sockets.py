"""The open OpenEnv sockets of this process, by API key: a key's cap on open sockets, and the keys of
open sockets looked up again twice every ORS_AUTH_CACHE_SECONDS.

A socket is authorized once, when it opens, and may stay open for hours; a key revoked (or expired)
meanwhile must not keep stepping on it. Rather than a timer per socket, one task looks up each key
that has sockets open (one query per key, whatever its number of sockets) and closes the sockets of
a key that no longer passes with 4401 (4403 when it lost the scope). Frames pay nothing for this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from django.conf import settings

from orsplatform.engine.errors import UNAVAILABLE
from orsplatform.openenv.wire import (
    CAPACITY_REACHED,
    CLOSE_FORBIDDEN,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    OpenEnvError,
)
from orsplatform.teams.auth import Access, AuthError, Caller, recheck_async

log = logging.getLogger("orsplatform.openenv")


class Revocable(Protocol):
    """What the registry asks of a socket (the consumer): close it, telling the client why."""

    async def revoke(self, code: int, message: str) -> None: ...


class OpenSockets:
    def __init__(self, *, run: Callable[..., Awaitable]) -> None:
        self._run = run  # a DB thread, for the lookups
        self._by_key: dict[int | None, set[Revocable]] = {}
        self._key_of: dict[Revocable, int | None] = {}
        self._tokens: dict[int, str] = {}
        self._watcher: asyncio.Task | None = None

    def count(self, caller: Caller) -> int:
        return len(self._by_key.get(caller.api_key_id, ()))

    def add(self, caller: Caller, token: str | None, socket: Revocable) -> None:
        """Count the socket against its key (anonymous callers share one count), or refuse it past
        ORS_OPENENV_MAX_SOCKETS_PER_KEY (CAPACITY_REACHED, close 4429)."""
        held = self._by_key.get(caller.api_key_id)
        limit = settings.ORS_OPENENV_MAX_SOCKETS_PER_KEY
        if held is not None and len(held) >= limit:
            raise OpenEnvError(CAPACITY_REACHED, f"This API key has {len(held)} sockets open here (limit {limit}); "
                                                 "close one first.", close=CLOSE_TRY_AGAIN, status=429)
        self._by_key.setdefault(caller.api_key_id, set()).add(socket)
        self._key_of[socket] = caller.api_key_id
        if caller.api_key_id is not None and token is not None:
            self._tokens[caller.api_key_id] = token
            if self._watcher is None or self._watcher.done():
                self._watcher = asyncio.create_task(self._watch())

    def remove(self, socket: Revocable) -> None:
        if socket not in self._key_of:
            return
        key_id = self._key_of.pop(socket)
        held = self._by_key[key_id]
        held.discard(socket)
        if not held:
            del self._by_key[key_id]
            if key_id is not None:
                self._tokens.pop(key_id, None)

    async def _watch(self) -> None:
        while self._tokens:
            # Twice per cache time: a revocation closes the sockets within the cache time, as
            # it refuses requests within it.
            await asyncio.sleep(settings.ORS_AUTH_CACHE_SECONDS / 2)
            try:
                await self.recheck()
            except Exception:
                log.exception("re-checking the keys of open sockets failed")

    async def recheck(self) -> None:
        """Look up every key with sockets open; close the sockets of those that no longer pass."""
        for key_id, token in list(self._tokens.items()):
            try:
                await recheck_async(token, Access.SESSIONS, self._run)
            except AuthError as exc:
                code = CLOSE_FORBIDDEN if exc.status == 403 else CLOSE_UNAUTHORIZED
                sockets = list(self._by_key.get(key_id, ()))
                log.info("closing %d socket(s) of API key %s: %s", len(sockets), key_id, exc)
                self._tokens.pop(key_id, None)
                await asyncio.gather(*(s.revoke(code, str(exc)) for s in sockets), return_exceptions=True)
            except UNAVAILABLE as exc:
                # The database is away: the sockets stay (their key was valid when last seen), and
                # the key is looked up again next time.
                log.warning("could not re-check API key %s of open sockets: %s", key_id, exc)
                return
