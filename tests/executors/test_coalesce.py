"""The celery executor's shared pipelines (executors/coalesce.py), against the real Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from orsplatform.executors.coalesce import Coalescer

pytestmark = pytest.mark.services  # the real Redis (REDIS_URL): not in make test-fast

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


class CountingRedis(aioredis.Redis):
    """Counts the pipelines sent: the round trips the callers share."""

    pipelines = 0

    def pipeline(self, *args, **kwargs):
        CountingRedis.pipelines += 1
        return super().pipeline(*args, **kwargs)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def shared():
    """(a Coalescer on the real Redis, a fresh key, the client), the key deleted afterwards."""
    client = CountingRedis.from_url(REDIS_URL)
    CountingRedis.pipelines = 0
    key = f"test-coalesce-{uuid.uuid4().hex}"
    yield Coalescer(client), key, client
    await client.delete(key)
    await client.aclose()


async def test_concurrent_callers_share_round_trips_and_each_gets_its_own_replies_in_order(shared):
    batch, key, client = shared

    def two(pipe):
        pipe.incr(key)
        pipe.incr(key)

    replies = await asyncio.gather(*[batch.run(two) for _ in range(50)])
    # Every caller's two increments are adjacent and in call order: 1,2 then 3,4 ...
    assert replies == [[2 * i + 1, 2 * i + 2] for i in range(50)]
    # The pipeline leaves on the loop's next pass, when all 50 have queued: one round trip.
    assert CountingRedis.pipelines == 1
    assert await batch.run(lambda pipe: pipe.get(key)) == [b"100"]


async def test_a_lone_caller_is_sent_at_once_and_commands_nobody_awaits_still_go_out_in_order(shared):
    batch, key, client = shared
    batch.push(lambda pipe: pipe.rpush(key, "a"))
    batch.push(lambda pipe: pipe.rpush(key, "b"))
    assert await batch.run(lambda pipe: pipe.lrange(key, 0, -1)) == [[b"a", b"b"]]
    batch.push(lambda pipe: pipe.rpush(key, "c"))
    await batch.flush()
    assert await client.lrange(key, 0, -1) == [b"a", b"b", b"c"]


async def test_a_failed_round_trip_raises_in_every_waiting_caller_and_logs_what_nobody_awaited(caplog):
    client = aioredis.from_url(f"redis://127.0.0.1:{closed_port()}/0", socket_connect_timeout=1)
    batch = Coalescer(client)
    try:
        with caplog.at_level(logging.WARNING, logger="orsplatform.executors.coalesce"):
            batch.push(lambda pipe: pipe.set("never", "written"))
            outcomes = await asyncio.gather(*[batch.run(lambda pipe: pipe.get("x")) for _ in range(3)],
                                            return_exceptions=True)
            await batch.flush()
        assert len(outcomes) == 3 and all(isinstance(o, RedisConnectionError) for o in outcomes), outcomes
        assert any("could not send" in r.getMessage() for r in caplog.records)
    finally:
        await client.aclose()


async def test_a_command_that_fails_fails_only_its_own_caller(shared):
    batch, key, client = shared
    good = asyncio.ensure_future(batch.run(lambda pipe: pipe.incr(key)))
    bad = asyncio.ensure_future(batch.run(lambda pipe: pipe.execute_command("NO-SUCH-COMMAND")))
    also_good = asyncio.ensure_future(batch.run(lambda pipe: pipe.incr(key)))
    outcomes = await asyncio.gather(good, bad, also_good, return_exceptions=True)
    assert outcomes[0] == [1] and outcomes[2] == [2]
    assert isinstance(outcomes[1], ResponseError) and "NO-SUCH-COMMAND" in str(outcomes[1]).upper()
    assert CountingRedis.pipelines == 1  # they did share the round trip


async def test_a_caller_whose_commands_cannot_be_built_is_told_and_the_others_are_sent(shared):
    batch, key, client = shared

    def broken(pipe):
        pipe.incr(key)
        raise ValueError("no such thing")

    outcomes = await asyncio.gather(batch.run(lambda pipe: pipe.incr(key)), batch.run(broken),
                                    batch.run(lambda pipe: pipe.incr(key)), return_exceptions=True)
    assert outcomes[0] == [1] and outcomes[2] == [2]  # the broken caller's half-built command is dropped
    assert isinstance(outcomes[1], ValueError)


async def test_a_cancelled_caller_does_not_stop_the_others(shared):
    batch, key, client = shared
    built = asyncio.Event()

    def incr_and_note(pipe):
        pipe.incr(key)
        built.set()

    first = asyncio.ensure_future(batch.run(lambda pipe: pipe.incr(key)))
    gone = asyncio.ensure_future(batch.run(incr_and_note))
    last = asyncio.ensure_future(batch.run(lambda pipe: pipe.incr(key)))
    await asyncio.wait_for(built.wait(), 5)  # its commands are in the pipeline being sent
    gone.cancel()  # e.g. its client disconnected
    assert await first == [1]
    # A caller that went away still had its commands sent (they were queued): the count says 3.
    assert await last == [3]
    assert gone.cancelled()
