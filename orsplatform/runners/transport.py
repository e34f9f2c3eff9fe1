"""The runner node's broker transport: kombu's Redis transport, taking up to BATCH messages from
the node's queue per round trip.

Kombu's Redis consumer asks for one message per BRPOP: at load, each message costs the node a
command, a poll registration and a reply of its own, though the queue holds several. BLMPOP
(Redis 7) pops up to COUNT messages in one blocking command, oldest first, so the queue drains in
order, and with one message waiting it is exactly a BRPOP. Nothing else changes: the same queues,
the same messages, the same delivery to the consumer.

Select it with Celery's ``broker_transport`` (node.py). It overrides two methods of kombu's
``Channel`` that are not public API: kombu is pinned to a minor version (pyproject.toml), and the
celery executor's tests run real nodes over it.
"""

from __future__ import annotations

from queue import Empty
from time import monotonic

import orjson
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str

BATCH = 32  # at most the node's prefetch window (node.py), so the consumer never holds more


class Channel(kombu_redis.Channel):
    _batched: bool | None = None  # whether BLMPOP is used here (decided at the first poll)

    def _uses_blmpop(self) -> bool:
        if self._batched is None:
            # BLMPOP came with Redis 7; HELLO (Redis 6, and allowed to a node's ACL user) says
            # which server this is. Prefixed keys are rewritten per command: kombu knows only BRPOP.
            try:
                hello = self.client.execute_command("HELLO")
                info = hello if isinstance(hello, dict) else dict(zip(hello[::2], hello[1::2], strict=False))
                version = bytes_to_str(info.get(b"version", info.get("version", b"0")))
                self._batched = not self.global_keyprefix and int(version.split(".")[0]) >= 7
            except Exception:  # an older server, or one that will not say: one message per poll
                self._batched = False
        return self._batched

    def _brpop_start(self, timeout=None):
        if not self._uses_blmpop():
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        self.client.connection.send_command("BLMPOP", timeout or 0, len(keys), *keys, "RIGHT", "COUNT", BATCH)

    def _brpop_read(self, **options):
        if not self._uses_blmpop():
            return super()._brpop_read(**options)
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BLMPOP", **options)
            except self.connection_errors:
                # As kombu does: the next poll reconnects.
                self.client.connection.disconnect()
                raise
            if not reply:
                raise Empty()
            dest, items = reply
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            for item in items:
                self.connection._deliver(orjson.loads(item), dest)  # as json.loads, in C
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()


class Transport(kombu_redis.Transport):
    Channel = Channel
