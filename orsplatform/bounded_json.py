"""The one JSON decoder for what clients send: every REST, ORS, OpenEnv and Rollout API body, the
X-Secrets header, OpenEnv socket frames and MCP requests, task rows and a package's JSON lines.

Two bounds, each refused with a message a 4xx can carry as its detail:
- depth: at most MAX_DEPTH levels of arrays and objects. The standard library's decoder recurses
  once per level and raised RecursionError (a 500, which the openreward client retries four times)
  on 100,000 levels of `[`; orjson stops at 1,024 levels, but a value even 1,000 deep still overflows
  the interpreter wherever Python (json.dumps for a JSONField, a template, a recursive check) walks it
  later, so the bound is well below that.
- finiteness: NaN, Infinity, -Infinity (which the standard library parses) and numbers too large for
  a double (1e400, which it parses as inf) are refused: no such value is JSON, PostgreSQL's jsonb
  refuses them at insert, and a Rollout API batch carrying one was answered a misleading 409.

orjson does the parsing (fast, and it refuses both already: the work here is the depth bound below
its own and saying which rule a body broke). No Django here: runner nodes and the ORS app import it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

MAX_DEPTH = 100
TOO_DEEP = (f"The JSON is nested too deeply: at most {MAX_DEPTH} levels of arrays and objects are accepted.")
NOT_FINITE = ("Non-finite numbers are not accepted in JSON (NaN, Infinity, -Infinity, or a number too large "
              "for a double).")
_CONTAINERS = (dict, list)


class JsonRefused(ValueError):
    """Not JSON the platform takes; str() is the reason, fit for a 4xx's detail."""


class JsonTooDeep(JsonRefused):
    def __init__(self) -> None:
        super().__init__(TOO_DEEP)


class JsonNotFinite(JsonRefused):
    def __init__(self) -> None:
        super().__init__(NOT_FINITE)


def loads(data: bytes | bytearray | memoryview | str, *, lone_surrogates: bool = False) -> Any:
    """The JSON value of `data` (UTF-8), or JsonRefused: JsonTooDeep, JsonNotFinite, or the base
    class for anything else that is not JSON ("Not valid JSON: <why>").

    `lone_surrogates`: accept a \\ud800 escape with no pair, as the standard library does (orjson
    refuses it), for a reader that cleans such strings itself before storing them (runs/wire.py:
    the openreward client's json.dumps writes whatever a model produced)."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if lone_surrogates and "surrogate" in exc.msg:
            value = _stdlib(data)
        else:
            raise _refusal(exc) from None
    if _may_be_deep(data) and _too_deep(value):
        raise JsonTooDeep()
    return value


def _refusal(exc: orjson.JSONDecodeError) -> JsonRefused:
    if "depth" in exc.msg or "recursion" in exc.msg:
        return JsonTooDeep()
    if "infinity" in exc.msg:
        return JsonNotFinite()
    at = exc.doc[exc.pos:exc.pos + 8] if isinstance(exc.doc, str) else ""
    if at.startswith(("NaN", "Infinity")):
        return JsonNotFinite()
    return JsonRefused(f"Not valid JSON: {exc}")


def _not_finite(_constant: str) -> Any:
    raise JsonNotFinite()


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonNotFinite()
    return value


def _stdlib(data: bytes | bytearray | str) -> Any:
    """The standard library's decoder, for the lone surrogates orjson refuses, with the same bounds."""
    try:
        return json.loads(data, parse_constant=_not_finite, parse_float=_finite)
    except RecursionError:
        raise JsonTooDeep() from None
    except JsonRefused:
        raise
    except ValueError as exc:
        raise JsonRefused(f"Not valid JSON: {exc}") from None


def _may_be_deep(data: bytes | bytearray | str) -> bool:
    """False when the text has too few brackets to nest past the bound (nearly every body: two
    C-speed counts instead of a walk of the value)."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") > MAX_DEPTH
    return data.count(b"[") + data.count(b"{") > MAX_DEPTH


def _too_deep(value: Any) -> bool:
    """Whether arrays and objects nest more than MAX_DEPTH levels (walked a level at a time, never
    recursively)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return True
        deeper = []
        for container in level:
            children = container.values() if type(container) is dict else container
            deeper += [child for child in children if type(child) in _CONTAINERS]
        level = deeper
    return False
