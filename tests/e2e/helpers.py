"""Helpers for the end-to-end tests: raw-HTTP episodes, SSE parsing, polling with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from django.apps import apps

from tests.envs.code_reference_solutions import SOLUTIONS
from tests.fixtures.ors import parse_sse, sse_result

__all__ = ["SOLUTIONS", "parse_sse", "sse_result", "wait_for", "raw_episode", "raw_call", "database_dump",
           "slow_solution", "assert_log_clean", "LOG_PROBLEMS"]

T = TypeVar("T")

# Substrings that must never appear in a server's log: unhandled exceptions in platform code, and
# the daphne/twisted zope.interface clash that breaks ors.Environment.list_tools() in-process, and
# database errors (e.g. SQLite lock timeouts) that made a request answer 503.
LOG_PROBLEMS = ("Traceback", "__provides__", "unhandled error", "reaper pass failed", "could not record tool call",
                "database unavailable")


def wait_for(condition: Callable[[], T], *, timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # polling interval, not a wait for an outcome


def raw_episode(http: httpx.Client, headers: dict[str, str], env: str, **create: Any) -> str:
    """``/create_session`` (JSON form) then ``/{env}/create``; returns the sid."""
    r = http.post("/create_session", headers=headers)
    assert r.status_code == 200, r.text
    sid = r.json()["sid"]
    r = http.post(f"/{env}/create", headers={**headers, "X-Session-ID": sid}, json=create)
    assert r.status_code == 200, r.text
    assert r.json() == {"sid": sid}
    return sid


def raw_call(http: httpx.Client, headers: dict[str, str], env: str, sid: str, body: dict) -> httpx.Response:
    return http.post(f"/{env}/call", headers={**headers, "X-Session-ID": sid, "Accept": "text/event-stream"},
                     json=body)


def slow_solution(task_id: str, seconds: float = 2.0) -> str:
    """A correct solution of a code task that takes ``seconds`` to load."""
    return f"import time\ntime.sleep({seconds})\n\n{SOLUTIONS[task_id]}"


def database_dump() -> str:
    """Every row of every model, as text (for searching for values that must not be stored)."""
    parts = []
    for model in apps.get_models():
        rows = list(model.objects.values())
        parts.append(f"{model._meta.label}: {rows!r}")
    return "\n".join(parts)


def assert_log_clean(log: str) -> None:
    found = [p for p in LOG_PROBLEMS if p in log]
    assert not found, f"server log contains {found}:\n{log[-6000:]}"
