"""OpenEnv's wire (/health, /schema, /metadata, /ws) by hand, and a step that runs a probe."""

import asyncio
import json

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from server import probes

app = FastAPI()
ACTION = {"title": "ProbeAction", "type": "object", "properties": {
    "probe": {"type": "string"}, "arg": {"type": "string", "default": ""}, "n": {"type": "integer", "default": 0}},
    "required": ["probe"]}


@app.get("/health")
def health():
    return {"status": "healthy"}


@app.get("/schema")
def schema():
    return {"action": ACTION, "observation": {"title": "ProbeObservation", "type": "object"},
            "state": {"title": "State", "type": "object"}}


@app.get("/metadata")
def metadata():
    return {"name": "hostile_env", "description": "probes"}


@app.websocket("/ws")
async def ws(socket: WebSocket):
    await socket.accept()
    steps = 0
    try:
        while True:
            message = json.loads(await socket.receive_text())
            kind = message.get("type")
            if kind == "reset":
                steps = 0
                await socket.send_text(json.dumps({"type": "observation", "data": {
                    "observation": {"ready": True}, "reward": None, "done": False}}))
            elif kind == "step":
                steps += 1
                action = message.get("data") or {}
                result = await asyncio.to_thread(probes.run, action.get("probe"), action.get("arg", ""),
                                                 int(action.get("n") or 0))
                await socket.send_text(json.dumps({"type": "observation", "data": {
                    "observation": {"result": result}, "reward": 0.0, "done": False}}))
            elif kind == "state":
                await socket.send_text(json.dumps({"type": "state", "data": {"step_count": steps}}))
            elif kind == "close":
                break
    except WebSocketDisconnect:
        pass
