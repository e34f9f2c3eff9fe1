"""The `openreward` client's Rollout API wire format, parsed and checked before anything is written.

A batch is `{"events": [...]}` (openreward/api/rollouts/background.py), each event one of:
- `{"eventType": "rollout", "eventId", "timestamp" (ms), "runName", "rolloutName"?, "environment"?,
  "environment_id"?, "variant"?, "variant_id"?, "split"?, "metadata"?, "task_spec"?, "run_info"?,
  "rollout_info"?, "step"?}` — sent alone and synchronously by `rollout.create(...)`;
- `{"eventType": "rollout_update", "eventId" (the rollout's), "timestamp", "rollout_info"?}`;
- `{"eventType": "message", "eventId", "timestamp", "index", "rolloutEventId", "type", "content"?,
  "contentReference"?, "summary"?, "name"?, "callId"?, "environment_id"?, "reward"?, "isFinished"?,
  "metadata"?}`.
None-valued keys are stripped by the client, so every optional key may be absent. The client retries
only on 5xx, so everything wrong with a batch is a 4xx here (it is dropped, not resent).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orsplatform import bounded_json
from orsplatform.runs.naming import BadRunName, run_name_clean

MESSAGE_TYPES = frozenset({"reasoning", "tool_call", "tool_result", "user_message", "assistant_message",
                           "system_message"})
MAX_EVENTS = 10_000
ID_MAX = 64


class BadBatch(ValueError):
    """A batch the platform refuses whole: status and detail for the client."""

    def __init__(self, detail: str, status: int = 422) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class RolloutStart:
    event_id: str
    timestamp: datetime
    run_name: str
    name: str = ""
    environment: str = ""
    environment_id: str = ""
    variant: str = ""
    variant_id: str = ""
    split: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    task_spec: Any = None
    run_info: dict[str, Any] | None = None
    rollout_info: dict[str, Any] | None = None
    step: int | None = None


@dataclass
class RolloutUpdate:
    event_id: str
    timestamp: datetime
    rollout_info: dict[str, Any] | None


@dataclass
class Message:
    event_id: str
    timestamp: datetime
    index: int
    rollout_event_id: str
    type: str
    content: str = ""
    content_reference: str = ""
    summary: str = ""
    name: str = ""
    call_id: str = ""
    reward: float | None = None
    is_finished: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    starts: list[RolloutStart] = field(default_factory=list)
    updates: list[RolloutUpdate] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.starts) + len(self.updates) + len(self.messages)


def decode_body(body: bytes, content_encoding: str | None, *, max_bytes: int) -> Any:
    """The JSON of a request body, gunzipped when the client says so (at most `max_bytes` once
    decompressed: a small gzip bomb is a 413, not a full memory)."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, max_bytes + 1)
        except zlib.error:
            raise BadBatch("The body is not valid gzip.", 400) from None
        if len(body) > max_bytes or inflater.unconsumed_tail:
            raise BadBatch(f"The decompressed body is larger than {max_bytes} bytes.", 413)
    elif encoding != "identity":
        raise BadBatch(f"Unsupported Content-Encoding {encoding!r}; send gzip or none.", 415)
    try:
        # Lone surrogates are taken (and cleaned by _clean): the client's json.dumps writes them.
        return bounded_json.loads(body, lone_surrogates=True)
    except (bounded_json.JsonTooDeep, bounded_json.JsonNotFinite) as exc:
        raise BadBatch(str(exc), 400) from None
    except ValueError:
        raise BadBatch("The body must be JSON: {\"events\": [...]}.", 400) from None


def _clean(value: Any) -> Any:
    """Strings PostgreSQL can store: no NUL characters, no lone surrogates (JSON escapes allow
    both; either would be a database error, a 500, on insert)."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _where(i: int, key: str) -> str:
    return f"events[{i}].{key}"


def _str(event: dict, key: str, i: int, *, required: bool = False, limit: int | None = None) -> str:
    value = event.get(key)
    if value is None:
        if required:
            raise BadBatch(f"{_where(i, key)} is required.")
        return ""
    if not isinstance(value, str):
        raise BadBatch(f"{_where(i, key)} must be a string.")
    if limit is not None and len(value) > limit:
        raise BadBatch(f"{_where(i, key)} is longer than {limit} characters.")
    return _clean(value)


def _int(event: dict, key: str, i: int, *, required: bool = False, minimum: int | None = None) -> int | None:
    value = event.get(key)
    if value is None:
        if required:
            raise BadBatch(f"{_where(i, key)} is required.")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**31 - 1:
        raise BadBatch(f"{_where(i, key)} must be an integer.")
    if minimum is not None and value < minimum:
        raise BadBatch(f"{_where(i, key)} must be at least {minimum}.")
    return value


def _time(event: dict, i: int) -> datetime:
    value = event.get("timestamp")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadBatch(f"{_where(i, 'timestamp')} must be milliseconds since the epoch.")
    try:
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise BadBatch(f"{_where(i, 'timestamp')} is out of range.") from None


def _object(event: dict, key: str, i: int) -> dict[str, Any] | None:
    value = event.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadBatch(f"{_where(i, key)} must be an object.")
    return _clean(value)


def _start(event: dict, i: int) -> RolloutStart:
    try:
        run_name = run_name_clean(event.get("runName"))
    except BadRunName as exc:
        raise BadBatch(f"{_where(i, 'runName')}: {exc}") from None
    if not run_name:
        raise BadBatch(f"{_where(i, 'runName')} is required.")
    rollout_info = _object(event, "rollout_info", i)
    return RolloutStart(
        event_id=_str(event, "eventId", i, required=True, limit=ID_MAX), timestamp=_time(event, i),
        run_name=run_name, name=_str(event, "rolloutName", i, limit=200),
        environment=_str(event, "environment", i, limit=200), environment_id=_str(event, "environment_id", i, limit=64),
        variant=_str(event, "variant", i, limit=200), variant_id=_str(event, "variant_id", i, limit=64),
        split=_str(event, "split", i, limit=100), metadata=_object(event, "metadata", i) or {},
        task_spec=_clean(event.get("task_spec")), run_info=_object(event, "run_info", i),
        rollout_info=rollout_info, step=_int(event, "step", i))


def _message(event: dict, i: int) -> Message:
    kind = event.get("type")
    if kind not in MESSAGE_TYPES:
        raise BadBatch(f"{_where(i, 'type')} must be one of {', '.join(sorted(MESSAGE_TYPES))}.")
    reward = event.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)
                               or not math.isfinite(reward)):
        raise BadBatch(f"{_where(i, 'reward')} must be a finite number.")
    finished = event.get("isFinished")
    if finished is not None and not isinstance(finished, bool):
        raise BadBatch(f"{_where(i, 'isFinished')} must be a boolean.")
    return Message(
        event_id=_str(event, "eventId", i, required=True, limit=ID_MAX), timestamp=_time(event, i),
        index=_int(event, "index", i, required=True, minimum=0),
        rollout_event_id=_str(event, "rolloutEventId", i, required=True, limit=ID_MAX), type=kind,
        content=_str(event, "content", i), content_reference=_str(event, "contentReference", i),
        summary=_str(event, "summary", i), name=_str(event, "name", i, limit=200),
        call_id=_str(event, "callId", i, limit=200), reward=None if reward is None else float(reward),
        is_finished=bool(finished), metadata=_object(event, "metadata", i) or {})


def parse_batch(data: Any) -> Batch:
    """The batch's events, every one checked; raises BadBatch for the first bad one."""
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise BadBatch("The body must be a JSON object {\"events\": [...]}.", 400)
    events = data["events"]
    if not events:
        raise BadBatch("events is empty.")
    if len(events) > MAX_EVENTS:
        raise BadBatch(f"At most {MAX_EVENTS} events per batch.", 413)
    batch = Batch()
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise BadBatch(f"events[{i}] must be an object.")
        kind = event.get("eventType")
        if kind == "message":
            batch.messages.append(_message(event, i))
        elif kind == "rollout":
            batch.starts.append(_start(event, i))
        elif kind == "rollout_update":
            batch.updates.append(RolloutUpdate(
                event_id=_str(event, "eventId", i, required=True, limit=ID_MAX), timestamp=_time(event, i),
                rollout_info=_object(event, "rollout_info", i)))
        else:
            raise BadBatch(f"{_where(i, 'eventType')} must be 'rollout', 'rollout_update' or 'message'.")
    return batch
