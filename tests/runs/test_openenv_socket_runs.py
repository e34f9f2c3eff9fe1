"""An OpenEnv WebSocket names its episodes' run by the X-Run header of its handshake; a reset's `run`
field wins for that episode (a real server: the socket path runs only on one)."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed

from orsplatform.episodes.models import Session
from tests.openenv.test_sockets import ask, open_socket


def test_a_sockets_x_run_names_its_episodes_and_a_resets_run_wins(server, owner):
    with open_socket(server, "builtin/math", {**owner.headers, "X-Run": "socket-run"}) as ws:
        first = ask(ws, {"type": "reset", "data": {"split": "test", "index": 1}})
        second = ask(ws, {"type": "reset", "data": {"split": "test", "index": 2, "run": "reset-run"}})
    sids = [r["data"]["observation"]["metadata"]["session_id"] for r in (first, second)]
    assert [Session.objects.get(sid=sid).run_name for sid in sids] == ["socket-run", "reset-run"]


def test_a_socket_with_a_bad_x_run_is_refused_with_an_error_frame_and_a_close(server, owner):
    # As every refused socket here: accepted, an OpenEnv error frame saying why, then the close.
    with open_socket(server, "builtin/math", {**owner.headers, "X-Run": "x" * 300}) as ws:
        frame = json.loads(ws.recv(timeout=30))
        assert frame["type"] == "error" and "200 characters" in frame["data"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 4400
    assert not Session.objects.exists()
