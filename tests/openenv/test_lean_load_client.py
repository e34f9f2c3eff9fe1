"""The hold benchmark's lean socket (bench/lean_ws.py) against a real server: it must be the same
client on the wire as ``GenericEnvClient`` (same frames, same answers), or the hold's figures would
measure something no trainer sends."""

from __future__ import annotations

import asyncio

import pytest
from openenv.core.generic_client import GenericEnvClient

from bench.lean_ws import LeanSocket, WsError
from orsplatform.episodes.models import ToolCall
from tests.e2e.helpers import wait_for
from tests.openenv.conftest import base_url

GUESS = {"type": "call_tool", "tool_name": "guess", "arguments": {"word": "zz"}}


def test_the_lean_socket_gets_the_answers_the_official_client_gets(server, member):
    url = base_url(server, "builtin/wordle")

    async def lean() -> tuple[dict, dict]:
        sock = await LeanSocket.open(url, member.headers, timeout=30)
        try:
            reset = await sock.request({"type": "reset", "data": {"split": "test", "index": 3}})
            step = await sock.request({"type": "step", "data": GUESS})
            return reset, step
        finally:
            await sock.close()

    reset, step = asyncio.run(lean())
    with GenericEnvClient(base_url=url, headers=member.headers).sync() as env:
        official_reset = env.reset(split="test", index=3)
        official_step = env.step(GUESS)

    assert reset["type"] == step["type"] == "observation"
    assert reset["data"]["observation"]["metadata"]["task_spec"] == \
        official_reset.observation["metadata"]["task_spec"]
    assert (step["data"]["done"], step["data"]["reward"]) == (official_step.done, official_step.reward)
    assert step["data"]["observation"]["result"] == official_step.observation["result"]
    assert step["data"]["observation"]["error"] == official_step.observation["error"] is None
    # Both steps are tool calls in the audit log, as any client's are.
    wait_for(lambda: ToolCall.objects.filter(name="guess").count() == 2 or None, what="two audited guesses")


def test_the_lean_socket_raises_on_an_error_frame_and_on_a_refused_key(server, member):
    url = base_url(server, "builtin/wordle")

    async def step_before_reset() -> None:
        sock = await LeanSocket.open(url, member.headers, timeout=30)
        try:
            await sock.request({"type": "step", "data": GUESS})
        finally:
            await sock.close()

    async def bad_key() -> None:
        sock = await LeanSocket.open(url, {"X-API-Key": "ors_not-a-key"}, timeout=30)
        await sock.request({"type": "reset", "data": {}})

    with pytest.raises(WsError, match="reset"):
        asyncio.run(step_before_reset())
    with pytest.raises((WsError, ConnectionResetError)):
        asyncio.run(bad_key())
