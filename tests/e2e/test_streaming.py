"""Tool-call streams over a real socket: disconnects, reconnects by task_id, keep-alive pings."""

from __future__ import annotations

import httpx

from orsplatform.episodes.models import Session, ToolCall
from tests.e2e.helpers import parse_sse, raw_call, raw_episode, slow_solution, sse_result, wait_for

CODE_TASK = {
    "id": "add",
    "prompt": "Write a function `add(a, b)` that returns the sum of the numbers `a` and `b`.",
    "entry": "add",
    "tests": ["assert add(1, 2) == 3", "assert add(-5, 5) == 0"],
}


def read_task_id_then_hang_up(url: str, headers: dict, sid: str, body: dict) -> str:
    """Start a call, read the stream up to its task_id event, then drop the connection."""
    with httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/code/call", json=body,
                         headers={**headers, "X-Session-ID": sid, "Accept": "text/event-stream"}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/event-stream"
            lines = r.iter_lines()
            assert next(lines) == "event: task_id"
            data = next(lines)
            assert data.startswith("data: ")
            return data[len("data: "):].strip()


def test_a_client_that_disconnects_mid_call_loses_no_audit_row_and_can_reconnect(any_server, owner):
    server = any_server
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "code", task_spec=CODE_TASK)
        body = {"name": "run", "input": {"code": slow_solution("add", 2)}}

        task_id = read_task_id_then_hang_up(server.url, owner.headers, sid, body)
        # The call sleeps for 2 s, so it is still running now that the client is gone.
        assert not ToolCall.objects.filter(task_id=task_id).exists()

        row = wait_for(
            lambda: ToolCall.objects.filter(task_id=task_id, status__in=[ToolCall.Status.OK, ToolCall.Status.ERROR],
                                            finished_at__isnull=False).first(),
            timeout=20, what="the audit row of the abandoned call")
        assert row.session.sid == sid
        assert (row.name, row.status, row.reward, row.finished) == ("run", ToolCall.Status.OK, 1.0, True)
        assert row.finished_at >= row.started_at

        # Reconnecting with the task_id returns the original result; it does not run the tool again.
        r = raw_call(http, owner.headers, "code", sid, {"task_id": task_id})
        assert r.status_code == 200
        events = parse_sse(r.text)
        assert events[0] == ("task_id", task_id)
        result = sse_result(r.text)
        assert result == row.output
        assert result["ok"] is True and result["output"]["reward"] == 1.0
        assert result["output"]["metadata"] == {"passed": 2, "total": 2, "timed_out": False}
        assert ToolCall.objects.filter(session__sid=sid).count() == 1

        # An id this session never issued is an error event, not a new call.
        r = raw_call(http, owner.headers, "code", sid, {"task_id": "0" * 32})
        assert ("error", "unknown task_id") in parse_sse(r.text)

        assert http.post("/delete", headers={**owner.headers, "X-Session-ID": sid}).status_code == 200
    session = Session.objects.get(sid=sid)
    assert session.status == Session.Status.DELETED
    assert session.calls == 1 and session.total_reward == 1.0


def test_a_long_call_keeps_its_stream_alive_with_ping_comments(any_servers, owner):
    server = any_servers(ORS_SSE_PING_SECONDS="0.5")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "code", task_spec=CODE_TASK)
        r = raw_call(http, owner.headers, "code", sid, {"name": "run", "input": {"code": slow_solution("add", 2)}})
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"

        assert ": ping\n\n" in r.text
        events = parse_sse(r.text)
        kinds = [e for e, _ in events]
        assert kinds[0] == "task_id" and kinds[-1] == "end"
        pings = [i for i, e in enumerate(kinds) if e == ":"]
        # A 2 s call with a 0.5 s ping interval: several pings, all between task_id and the result.
        assert len(pings) >= 2, r.text
        assert all(0 < i < kinds.index("end") for i in pings)
        result = sse_result(r.text)
        assert result["ok"] is True and result["output"]["reward"] == 1.0
