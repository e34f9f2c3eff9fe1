"""OpenEnv's wire (/health, /schema, /metadata, /ws); each observation says what the server's
process has of ECHO_TOKEN (declared in the manifest's required_secrets) and UNDECLARED_TOKEN, and
which container it runs in."""

import json
import os
import socket

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

app = FastAPI()
NAMES = ("ECHO_TOKEN", "UNDECLARED_TOKEN")


def observe() -> dict:
    return {"environ": {name: os.environ.get(name) for name in NAMES}, "container": socket.gethostname()}


@app.get("/health")
def health():
    return {"status": "healthy"}


@app.get("/schema")
def schema():
    return {"action": {"title": "EchoAction", "type": "object", "properties": {}},
            "observation": {"title": "EchoObservation", "type": "object"}, "state": {"title": "State", "type": "object"}}


@app.get("/metadata")
def metadata():
    return {"name": "echo_env", "description": "says its environment"}


@app.websocket("/ws")
async def ws(sock: WebSocket):
    await sock.accept()
    try:
        while True:
            kind = json.loads(await sock.receive_text()).get("type")
            if kind in ("reset", "step"):
                await sock.send_text(json.dumps({"type": "observation", "data": {
                    "observation": observe(), "reward": 1.0 if kind == "step" else None, "done": kind == "step"}}))
            elif kind == "state":
                await sock.send_text(json.dumps({"type": "state", "data": {}}))
            elif kind == "close":
                break
    except WebSocketDisconnect:
        pass
