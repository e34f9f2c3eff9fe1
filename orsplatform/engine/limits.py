"""Per-team limits: concurrent open sessions and tool calls per second.

Without REDIS_URL the counters live in this process (exact for one gateway). With REDIS_URL they
are shared by every gateway process: open sessions are a sorted set per team (member: the sid,
score: when its gateway last vouched for it, so slots of a crashed gateway lapse after
SLOT_LEASE_SECONDS), and the rate is a token bucket updated atomically by a Lua script.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

from orsplatform.engine.errors import GatewayError
from orsplatform.executors.keys import Keys

log = logging.getLogger(__name__)

CAPACITY_DETAIL = "Team is at maximum capacity: {what} (limit {limit}). Retry later."

_TOKEN_BUCKET = """
local key, rate, now = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1]) or rate
local ts = tonumber(state[2]) or now
tokens = math.min(rate, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= 1 then tokens = tokens - 1; allowed = 1 end
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', key, 60)
return allowed
"""

SLOT_LEASE_SECONDS = 120
RENEW_CHUNK = 1000  # sessions per ZADD when a gateway vouches for its open sessions

_ACQUIRE_SLOT = """
local now, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - lease)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('EXPIRE', KEYS[1], lease * 2)
return 1
"""


def over_capacity(what: str, limit: int, retry_after: int) -> GatewayError:
    return GatewayError(429, CAPACITY_DETAIL.format(what=what, limit=limit), {"Retry-After": str(retry_after)})


class Limits:
    def __init__(self) -> None:
        self._slots: dict[int, set[str]] = {}
        self._buckets: dict[int, tuple[float, float]] = {}
        self._redis = None
        if settings.REDIS_URL:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(settings.REDIS_URL)
            self._acquire_script = self._redis.register_script(_ACQUIRE_SLOT)
            self._bucket_script = self._redis.register_script(_TOKEN_BUCKET)

    async def acquire_session(self, team_id: int | None, sid: str, limit: int | None) -> bool:
        """Take an open-session slot for sid, or raise 429; False when the team has no limit (no
        slot taken, so none to release)."""
        if team_id is None or limit is None:
            return False
        if self._redis is not None:
            ok = await self._acquire_script(keys=[Keys(settings.ORS_REDIS_PREFIX).slots(team_id)],
                                            args=[sid, limit, time.time(), SLOT_LEASE_SECONDS])
        else:
            slots = self._slots.setdefault(team_id, set())
            ok = sid in slots or len(slots) < limit
            if ok:
                slots.add(sid)
        if not ok:
            raise over_capacity("concurrent open sessions", limit, retry_after=5)
        return True

    async def release_session(self, team_id: int | None, sid: str) -> None:
        if team_id is None:
            return
        if self._redis is not None:
            try:
                await self._redis.zrem(Keys(settings.ORS_REDIS_PREFIX).slots(team_id), sid)
            except Exception:
                log.warning("could not release session slot for team %s", team_id)
        else:
            self._slots.get(team_id, set()).discard(sid)

    async def renew(self, sessions: list[tuple[int, str]]) -> None:
        """Vouch for this gateway's open sessions (called with the activity flush)."""
        if self._redis is None or not sessions:
            return
        now = time.time()
        by_team: dict[int, dict[str, float]] = {}
        for team_id, sid in sessions:
            by_team.setdefault(team_id, {})[sid] = now
        # One ZADD per team and RENEW_CHUNK sessions, not one per session: with thousands of
        # sessions open, encoding a command each held the event loop for a good part of a second.
        keys = Keys(settings.ORS_REDIS_PREFIX)
        async with self._redis.pipeline(transaction=False) as pipe:
            for team_id, members in by_team.items():
                sids = list(members)
                for start in range(0, len(sids), RENEW_CHUNK):
                    pipe.zadd(keys.slots(team_id), {sid: now for sid in sids[start:start + RENEW_CHUNK]}, xx=True)
            await pipe.execute()

    async def take_call_token(self, team_id: int | None, rate: int | None) -> None:
        """One tool call's token from the team's bucket (capacity = rate), or raise 429."""
        if team_id is None or rate is None:
            return
        now = time.time()
        if self._redis is not None:
            ok = await self._bucket_script(keys=[f"{settings.ORS_REDIS_PREFIX}:calls:{team_id}"], args=[rate, now])
        else:
            tokens, ts = self._buckets.get(team_id, (float(rate), now))
            tokens = min(float(rate), tokens + (now - ts) * rate)
            ok = tokens >= 1
            self._buckets[team_id] = (tokens - 1 if ok else tokens, now)
        if not ok:
            raise over_capacity("tool calls per second", rate, retry_after=1)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
