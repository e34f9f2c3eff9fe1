"""Session lifecycle and tenancy through a real server: idle expiry, other teams, anonymous callers."""

from __future__ import annotations

import httpx

from orsplatform.episodes.models import Session
from tests.e2e.helpers import parse_sse, raw_call, raw_episode, sse_result, wait_for


def test_an_idle_session_expires_and_then_answers_404_expired(any_servers, owner):
    server = any_servers(ORS_IDLE_TIMEOUT_SECONDS="1", ORS_REAPER_INTERVAL_SECONDS="0.2")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "math", split="test", index=0)
        # No request touches the session from here on: a ping would count as activity.
        row = wait_for(lambda: Session.objects.filter(sid=sid, status=Session.Status.EXPIRED).first(),
                       timeout=10, what="the session to expire")
        assert row.ended_at is not None

        headers = {**owner.headers, "X-Session-ID": sid}
        r = http.post("/ping", headers=headers)
        assert r.status_code == 404
        assert "expired" in r.json()["detail"]
        r = http.get("/math/prompt", headers=headers)
        assert r.status_code == 404 and "expired" in r.json()["detail"]
        # Deleting an expired session is not an error, and leaves it expired.
        assert http.post("/delete", headers=headers).status_code == 200
    assert Session.objects.get(sid=sid).status == Session.Status.EXPIRED


def test_a_session_in_use_does_not_expire(servers, owner):
    server = servers(ORS_IDLE_TIMEOUT_SECONDS="1", ORS_REAPER_INTERVAL_SECONDS="0.2")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "math", split="test", index=0)
        other = raw_episode(http, owner.headers, "math", split="test", index=1)
        headers = {**owner.headers, "X-Session-ID": sid}
        # Keep pinging one session until the other, untouched one has been reaped.
        def other_expired() -> bool:
            assert http.post("/ping", headers=headers).status_code == 200
            return Session.objects.filter(sid=other, status=Session.Status.EXPIRED).exists()

        wait_for(other_expired, timeout=10, what="the untouched session to expire")
        assert http.post("/ping", headers=headers).status_code == 200
        assert Session.objects.get(sid=sid).status != Session.Status.EXPIRED


def test_another_teams_key_sees_no_session_and_an_anonymous_caller_is_refused(server, owner, outsider):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "math", split="test", index=4)
        submit = {"name": "submit", "input": {"answer": "1"}}

        def requests(headers: dict) -> dict[str, httpx.Response]:
            h = {**headers, "X-Session-ID": sid}
            return {
                "ping": http.post("/ping", headers=h),
                "prompt": http.get("/math/prompt", headers=h),
                "call": http.post("/math/call", headers={**h, "Accept": "text/event-stream"}, json=submit),
                "delete": http.post("/delete", headers=h),
            }

        for name, r in requests(outsider.headers).items():
            assert r.status_code == 404, (name, r.status_code, r.text)
            assert r.headers["content-type"] == "application/json"
            assert r.json() == {"detail": "Session not found."}, name

        for name, r in requests({}).items():
            assert r.status_code == 401, (name, r.status_code, r.text)
            assert "detail" in r.json()

        bad_key = {"X-API-Key": "ors_00000000_" + "0" * 32}
        for name, r in requests(bad_key).items():
            assert r.status_code == 401, (name, r.status_code, r.text)

        r = http.post("/create_session", headers={"Accept": "text/event-stream"})
        assert r.status_code == 401 and "detail" in r.json()

        # A task_id of the owner's session does not open its result to another team's session.
        task_id = parse_sse(raw_call(http, owner.headers, "math", sid,
                                     {"name": "no_such_tool", "input": {}}).text)[0][1]
        theirs = raw_episode(http, outsider.headers, "math", split="test", index=4)
        r = raw_call(http, outsider.headers, "math", theirs, {"task_id": task_id})
        assert parse_sse(r.text) == [("error", "unknown task_id")]

        # /delete_session of an id the caller does not own is a no-op, as for any throwaway id.
        r = http.post("/delete_session", headers={**outsider.headers, "X-Session-ID": sid})
        assert r.status_code == 200

        # None of that touched the owner's episode; the owner may also use a bearer token.
        assert Session.objects.get(sid=sid).status not in (Session.Status.DELETED, Session.Status.EXPIRED)
        bearer = {"Authorization": f"Bearer {owner.token}", "X-Session-ID": sid}
        assert http.post("/ping", headers=bearer).status_code == 200
        r = http.get("/math/prompt", headers=bearer)
        assert r.status_code == 200 and r.json()[0]["type"] == "text"
        result = sse_result(raw_call(http, owner.headers, "math", sid, submit).text)
        assert result["ok"] is True and result["output"]["finished"] is True
        assert http.post("/delete", headers={**owner.headers, "X-Session-ID": sid}).json() == {"sid": sid}
        assert http.post("/ping", headers={**owner.headers, "X-Session-ID": sid}).status_code == 410
