"""The per-call hop from a gateway to a runner node: a Redis list per node (its inbox) and a small
message format of our own (docs/runner-nodes.md). No Django here: runner nodes import it.

Why not a Celery task per message: every session's setup, tool call, prompt and teardown crosses
this hop, a few per episode, and each is only handed to the node's event loop (nothing a Celery
worker offers is used: no result, no retry, no routing, no ack after the work). Celery's own path
costs the gateway a thread hop into kombu and a routed publish (whose binding table a restarted
Redis loses until the node reconnects), and the node a Request, a trace and a pool thread per
message; the shortcuts that avoided those had to build Celery's wire format by hand and override
private kombu methods. A list needs one LPUSH from the gateway (pipelined with its other writes)
and one blocking pop on the node for up to BATCH messages.

A message is a JSON array ``[VERSION, op, args]``; ``args`` are the op's positional arguments
(node.py lists them). Gateways push on the left, the node pops from the right: oldest first. A
popped message is gone (at most once): a node that dies holding it has lost its sessions anyway,
and a call is never run twice (the node also drops a task id it has seen).
"""

from __future__ import annotations

from typing import Any

import orjson

VERSION = 1
OPS = frozenset({"setup", "call", "prompt", "task_tools", "state", "teardown"})
BATCH = 32  # messages taken per round trip at most (BLMPOP ... COUNT)


class BadMessage(ValueError):
    """Not a message of this protocol (another version, an unknown op, not JSON)."""


def message(op: str, *args: Any) -> bytes:
    if op not in OPS:
        raise ValueError(f"unknown runner op {op!r}")
    return orjson.dumps([VERSION, op, args])


def parse(raw: bytes) -> tuple[str, list]:
    try:
        version, op, args = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise BadMessage(f"unreadable runner message: {exc}") from None
    if version != VERSION or op not in OPS or not isinstance(args, list):
        raise BadMessage(f"not a runner message of version {VERSION}: {str(raw[:80])}")
    return op, args
