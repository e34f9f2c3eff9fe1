"""The runner node's broker transport (runners/transport.py) against the real Redis, through kombu's
own consumer loop: the path a node's Celery consumer takes."""

from __future__ import annotations

import os
import time
import uuid

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from orsplatform.runners import transport
from orsplatform.runners.transport import BATCH

pytestmark = pytest.mark.services  # the real Redis (REDIS_URL): not in make test-fast

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


class CountingChannel(transport.Channel):
    """The node's channel, counting the replies it reads from its queue: its round trips (Redis's
    own command counts would include every other client of a shared server)."""

    reads = 0

    def _brpop_read(self, **options):
        CountingChannel.reads += 1
        return super()._brpop_read(**options)


class CountingTransport(transport.Transport):
    Channel = CountingChannel


def consume(connection: Connection, queue: Queue, count: int, *, batched: bool | None = None) -> list[int]:
    got: list[int] = []

    def on_message(body, message) -> None:
        got.append(body["n"])
        message.ack()

    with Consumer(connection, queues=[queue], callbacks=[on_message], accept=["json"]) as consumer:
        if batched is not None:
            consumer.channel._batched = batched  # the choice HELLO would have made
        deadline = time.monotonic() + 10
        while len(got) < count and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=1)
            except TimeoutError:
                continue
    return got


@pytest.fixture
def queue():
    name = f"test-transport-{uuid.uuid4().hex}"
    yield Queue(name, Exchange(name, type="direct"), routing_key=name)
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(name, f"_kombu.binding.{name}")


def publish(queue: Queue, count: int) -> None:
    with Connection(REDIS_URL) as connection:
        producer = Producer(connection.channel(), serializer="json")
        for n in range(count):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue])


def test_queued_messages_arrive_in_order_several_per_round_trip(queue):
    with Connection(REDIS_URL, transport=CountingTransport) as connection:
        queue(connection.channel()).declare()
        publish(queue, 3 * BATCH)
        CountingChannel.reads = 0
        assert consume(connection, queue, 3 * BATCH) == list(range(3 * BATCH))
        assert connection.default_channel._uses_blmpop()  # Redis 7 here
        # BATCH messages per BLMPOP from a full queue.
        assert CountingChannel.reads == 3


def test_without_blmpop_it_is_kombus_brpop_and_delivers_the_same(queue):
    with Connection(REDIS_URL, transport=CountingTransport) as connection:
        queue(connection.channel()).declare()
        publish(queue, 5)
        CountingChannel.reads = 0
        assert consume(connection, queue, 5, batched=False) == [0, 1, 2, 3, 4]
        assert CountingChannel.reads == 5  # one message per round trip, as kombu does
