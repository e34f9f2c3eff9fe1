"""How many prompt renders (hub/services.task_prompt_render: tenant code in a sandboxed child, up to
its timeout) run at once per signed-in user and per team of that user.

Any signed-in user may render any public environment's prompts, so without a cap one user (or one
team's users together) could keep every CPU busy with another team's slowest get_prompt(). A
render takes a slot on the user and on each of the user's teams, all or none, and gives them back
when it ends. With REDIS_URL the slots are shared by every web process (a sorted set per holder,
scored by when the slot was taken, so the slots of a killed process lapse after LEASE_SECONDS);
without it they live in this process, which is the embedded default's only one.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from functools import cache

from django.conf import settings

# Longer than any render may last (its timeout, the child's kill, the cache write).
LEASE_SECONDS = 120

_ACQUIRE = """
local now, lease, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - lease)
  if redis.call('ZCARD', key) >= tonumber(ARGV[3 + i]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, member)
  redis.call('EXPIRE', key, lease * 2)
end
return 0
"""


class RenderBusy(Exception):
    """The user, or one of the user's teams, has as many renders running as allowed (429)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


_lock = threading.Lock()
_held: dict[str, set[str]] = {}


@cache
def _redis():
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    return client, client.register_script(_ACQUIRE)


def _holders(user_id: int, team_ids: list[int]) -> list[tuple[str, int, str]]:
    """(key, limit, what) for the user and each of its teams."""
    return [(f"user:{user_id}", settings.ORS_PROMPT_RENDERS_PER_USER, "you"),
            *((f"team:{t}", settings.ORS_PROMPT_RENDERS_PER_TEAM, "your team") for t in sorted(set(team_ids)))]


def _busy(limit: int, what: str) -> RenderBusy:
    return RenderBusy(f"Too many prompt renders at once: {what} may run {limit} at a time. "
                      "Try again when one has finished.")


def _acquire(holders: list[tuple[str, int, str]], member: str) -> None:
    if settings.REDIS_URL:
        client, script = _redis()
        keys = [f"{settings.ORS_REDIS_PREFIX}:renders:{key}" for key, _, _ in holders]
        refused = script(keys=keys, args=[time.time(), LEASE_SECONDS, member, *(limit for _, limit, _ in holders)])
        if refused:
            _, limit, what = holders[int(refused) - 1]
            raise _busy(limit, what)
        return
    with _lock:
        for key, limit, what in holders:
            if len(_held.get(key, ())) >= limit:
                raise _busy(limit, what)
        for key, _, _ in holders:
            _held.setdefault(key, set()).add(member)


def _release(holders: list[tuple[str, int, str]], member: str) -> None:
    if settings.REDIS_URL:
        client, _ = _redis()
        with client.pipeline(transaction=False) as pipe:
            for key, _, _ in holders:
                pipe.zrem(f"{settings.ORS_REDIS_PREFIX}:renders:{key}", member)
            pipe.execute()
        return
    with _lock:
        for key, _, _ in holders:
            held = _held.get(key)
            if held is not None:
                held.discard(member)
                if not held:
                    del _held[key]


def renders_running(*, user_id: int) -> int:
    """How many renders the user has running now (for operators and tests)."""
    if settings.REDIS_URL:
        client, _ = _redis()
        key = f"{settings.ORS_REDIS_PREFIX}:renders:user:{user_id}"
        return int(client.zcount(key, time.time() - LEASE_SECONDS, "+inf"))
    with _lock:
        return len(_held.get(f"user:{user_id}", ()))


@contextlib.contextmanager
def render_slot(*, user_id: int, team_ids: list[int]) -> Iterator[None]:
    """Hold a render slot of the user and of each of its teams for the block, or raise RenderBusy."""
    holders = _holders(user_id, team_ids)
    member = uuid.uuid4().hex
    _acquire(holders, member)
    try:
        yield
    finally:
        _release(holders, member)
