"""The platform's shim inside a container environment: ``python3 /.ors/shim.py SPEC_JSON``.

Runs with the Python of the author's image (standard library only; this folder is bound in
read-only). It starts what the author ships (the image's own entrypoint and command, in its own
working directory and environment) on the container's loopback (the container has no other
network), waits for its ``/health``, and then speaks the platform's worker protocol on its stdin
and stdout (frames of a 4-byte big-endian length and a JSON object, as sandbox/worker.py does), so
the supervisor (sandbox/pool.py) drives a container exactly as it drives a Python worker.

Each session is one WebSocket to the author's server at ``/ws``, as OpenEnv's own client opens one:
setup resets it with the task spec, a call is a step (``call_tool`` for a tool environment), stop
closes it. Answers carry the server's own serialized observation, in the shape
sandbox/openenv_host.py gives it, so the OpenEnv face and the ORS face serve a container
exactly as they serve an OpenEnv-SDK class; the state is the server's answer to ``state``, asked
only when a client asks for it (``op_state``), as OpenEnv's own client asks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ws import Closed, WebSocket  # noqa: E402

HEADER = struct.Struct(">I")
HOST = "127.0.0.1"
STEP_TOOL = "step"
IDLE_SOCKETS = 64
KEY = "openenv"


class ServerGone(Exception):
    pass


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """A GET on the author's server: (status, body)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return status, body


def _unchunk(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2:]
    return b"".join(out)


def action_kind(schema: dict) -> str:
    """``mcp`` when the server's action is OpenEnv's CallToolAction (a tool environment), else ``step``."""
    action = schema.get("action") if isinstance(schema, dict) else None
    return "mcp" if "call_tool" in dumps(action) or "tool_name" in dumps((action or {}).get("properties", {})) else "step"


def block(data: dict) -> dict:
    # No state: the server is asked for it only when a client asks (op_state), as OpenEnv's own
    # client does; asking after every reset and step doubled the server's work per step.
    return {"type": "text", "text": dumps(data.get("observation")), "detail": {KEY: {"observation": data}}}


class Session:
    def __init__(self, socket: WebSocket) -> None:
        self.socket = socket
        self.prompt: dict | None = None
        self.asking = 0  # requests in flight: a socket stopped under one is not reused
        self.clean = True  # nothing failed on it: it may serve the pair's next episode

    async def ask(self, *messages: dict) -> list[dict]:
        """Send the messages at once (the server answers them in order) and read each answer."""
        self.asking += 1
        try:
            for message in messages:
                self.socket.send(dumps(message))
            await self.socket.writer.drain()
            return [json.loads(await self.socket.receive()) for _ in messages]
        except (Closed, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            self.clean = False
            raise ServerGone(f"The environment's server closed the session: {exc}") from None
        finally:
            self.asking -= 1


class Shim:
    def __init__(self, spec: dict) -> None:
        self.port = int(spec.get("port") or 8000)
        self.command = list(spec.get("command") or [])
        self.start_seconds = float(spec.get("start_seconds") or 120)
        self.server: asyncio.subprocess.Process | None = None
        self.sessions: dict[str, Session] = {}
        # Sockets whose episode ended cleanly, kept for the next one: a reset on an open socket is a
        # new episode on OpenEnv's server, as its own client reuses one socket per rollout slot
        # (a new socket costs the server a handshake and a new environment instance).
        self.idle: list[WebSocket] = []
        self.schema: dict = {}
        self.kind = "step"

    async def start(self, environ: dict | None = None) -> None:
        """Start the server; `environ`: the session's declared secrets, as variables of its process."""
        if not self.command:
            raise SystemExit("The image has no command (CMD or ENTRYPOINT) to start its server with.")
        env = dict(os.environ, **(environ or {}), PORT=str(self.port))
        self.server = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=2, stderr=2, env=env)
        deadline = time.monotonic() + self.start_seconds
        while True:
            if self.server.returncode is not None:
                raise SystemExit(f"The image's server ({' '.join(self.command)[:200]}) exited with status "
                                 f"{self.server.returncode} before it answered /health.")
            try:
                status, _ = await http_get(self.port, "/health", timeout=2)
                if status == 200:
                    break
            except (OSError, asyncio.TimeoutError, ValueError, IndexError):  # noqa: UP041 - 3.10 images
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"The image's server did not answer /health on port {self.port} within "
                                 f"{self.start_seconds:g} s.")
            await asyncio.sleep(0.02)
        status, body = await http_get(self.port, "/schema")
        self.schema = json.loads(body) if status == 200 else {}
        self.kind = action_kind(self.schema)

    # --- operations ------------------------------------------------------------------------

    async def op_setup(self, msg: dict) -> dict | None:
        spec = msg.get("task_spec")
        reset = {"type": "reset", "data": spec if isinstance(spec, dict) else {}}
        session = None
        while self.idle:
            session = Session(self.idle.pop())
            try:
                [observation] = await session.ask(reset)
                break
            except ServerGone:  # the server dropped it meanwhile: another one
                session.socket.close()
                session = None
        if session is None:
            try:
                socket = await WebSocket.connect(HOST, self.port, "/ws")
            except (OSError, Closed) as exc:
                raise SetupError(f"The environment's server refused a session: {exc}") from None
            session = Session(socket)
            [observation] = await session.ask(reset)
        socket = session.socket
        if observation.get("type") != "observation":
            socket.close()
            raise SetupError(f"reset failed: {_message(observation)}")
        session.prompt = block(observation.get("data") or {})
        self.sessions[msg["sid"]] = session
        return {"prompt": [session.prompt], "task_tools": []} if msg.get("first") else None

    def _session(self, sid: str) -> Session:
        session = self.sessions.get(sid)
        if session is None:
            raise UnknownSession(sid)
        return session

    async def op_prompt(self, msg: dict) -> list:
        return [self._session(msg["sid"]).prompt]

    async def op_task_tools(self, msg: dict) -> list:
        self._session(msg["sid"])
        return []

    async def op_call(self, msg: dict) -> dict:
        session = self._session(msg["sid"])
        name, tool_input = msg.get("name"), msg.get("input") or {}
        if self.kind == "mcp":
            action = {"type": "call_tool", "tool_name": name, "arguments": tool_input}
        elif name != STEP_TOOL:
            return {"result": {"ok": False, "error": f"{name} is not a valid tool; this environment takes "
                                                     f"'{STEP_TOOL}'.", "reason": "not_found"}}
        else:
            action = tool_input
        try:
            [observation] = await session.ask({"type": "step", "data": action})
        except ServerGone as exc:
            return {"exception": str(exc)}
        if observation.get("type") != "observation":
            session.clean = False
            error = observation.get("data") or {}
            if error.get("code") == "VALIDATION_ERROR":
                return {"result": {"ok": False, "error": f"Invalid action: {_message(observation)}",
                                   "reason": "input_validation"}}
            return {"exception": _message(observation)}
        data = observation.get("data") or {}
        fields = data.get("observation") or {}
        error = fields.get("error") if self.kind == "mcp" else None
        if error:
            text = error.get("message", error) if isinstance(error, dict) else error
            reason = error.get("error_type", "execution_error") if isinstance(error, dict) else "execution_error"
            return {"result": {"ok": False, "error": str(text), "reason": str(reason)}}
        reward = data.get("reward")
        output = {"blocks": [{"type": "text", "text": self._text(fields)}],
                  "metadata": {KEY: {"observation": data}},
                  "reward": None if reward is None else float(reward), "finished": bool(data.get("done"))}
        return {"result": {"ok": True, "output": output}}

    def _text(self, fields: dict) -> str:
        result = fields.get("result") if self.kind == "mcp" else None
        if isinstance(result, dict) and isinstance(result.get("content"), list):
            texts = [c.get("text") for c in result["content"] if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if texts:
                return "\n".join(texts)
        if isinstance(result, str):
            return result
        return dumps(fields)

    async def op_state(self, msg: dict) -> dict:
        session = self._session(msg["sid"])
        [state] = await session.ask({"type": "state"})
        if state.get("type") != "state":
            raise ServerGone(f"state failed: {_message(state)}")
        return state.get("data") or {}

    async def op_stop(self, msg: dict) -> None:
        session = self.sessions.pop(msg["sid"], None)
        if session is None:
            return
        if session.clean and not session.asking and len(self.idle) < IDLE_SOCKETS:
            self.idle.append(session.socket)
            return
        try:
            session.socket.send(dumps({"type": "close"}))
        finally:
            session.socket.close()

    async def op_inspect(self, msg: dict) -> dict:
        """What publishing records: the server's schemas and metadata, and the ORS tools (its MCP
        tools, listed as OpenEnv's client lists them, or one ``step`` tool taking its action)."""
        status, body = await http_get(self.port, "/metadata")
        metadata = json.loads(body) if status == 200 else {}
        if self.kind == "mcp":
            socket = await WebSocket.connect(HOST, self.port, "/ws")
            session = Session(socket)
            try:
                _, listed = await session.ask({"type": "reset", "data": {}},
                                              {"type": "step", "data": {"type": "list_tools"}})
            finally:
                socket.close()
            observation = (listed.get("data") or {}).get("observation") or {}
            tools = [{"name": t.get("name"), "description": t.get("description") or "",
                      "input_schema": t.get("input_schema") or t.get("inputSchema") or
                      {"type": "object", "properties": {}}} for t in observation.get("tools") or []]
        else:
            action = self.schema.get("action") or {"type": "object"}
            title = action.get("title") or "action"
            tools = [{"name": STEP_TOOL, "description": f"Take a step: an {title}. {action.get('description') or ''}"
                      .strip(), "input_schema": action}]
        return {"kind": self.kind, "schema": self.schema, "metadata": metadata, "tools": tools}


class SetupError(Exception):
    pass


class UnknownSession(Exception):
    pass


def _message(answer: dict) -> str:
    data = answer.get("data") if isinstance(answer, dict) else None
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return dumps(answer)[:2000]


async def serve(shim: Shim, reader: asyncio.StreamReader, writer: asyncio.WriteTransport) -> None:
    ops = {"setup": shim.op_setup, "prompt": shim.op_prompt, "task_tools": shim.op_task_tools,
           "call": shim.op_call, "stop": shim.op_stop, "inspect": shim.op_inspect,
           "state": shim.op_state}
    tasks: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()
    # The replies of one pass of the loop leave in one write: every system call here is a ptrace
    # stop under gVisor, and under load several sessions' answers come in the same pass.
    replies: list[bytes] = []

    def flush() -> None:
        writer.write(b"".join(replies))
        replies.clear()

    def send(message: dict) -> None:
        body = dumps(message).encode()
        if not replies:
            loop.call_soon(flush)
        replies.append(HEADER.pack(len(body)) + body)

    async def handle(msg: dict) -> None:
        reply: dict = {"id": msg.get("id")}
        try:
            reply["value"] = await ops[msg["op"]](msg)
            reply["ok"] = True
        except UnknownSession:
            reply.update(ok=False, kind="unknown")
        except SetupError as exc:
            reply.update(ok=False, kind="setup", error=str(exc))
        except ServerGone as exc:
            reply.update(ok=False, kind="setup" if msg.get("op") == "setup" else "error", error=str(exc))
        except Exception as exc:
            reply.update(ok=False, kind="error", error=f"{type(exc).__name__}: {exc}")
        send(reply)

    send({"id": 0, "ok": True, "value": {"pid": os.getpid()}})
    while True:
        try:
            (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
            msg = json.loads(await reader.readexactly(size))
        except (asyncio.IncompleteReadError, ValueError):
            return  # the supervisor closed the pipe (or spoke garbage): the container ends
        task = asyncio.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def read_environ(reader: asyncio.StreamReader) -> dict:
    """The first frame, when the spec says one comes: the server's secrets (sent on stdin, so that
    neither the container's configuration nor its command line holds them)."""
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        environ = json.loads(await reader.readexactly(size)).get("environ")
    except (asyncio.IncompleteReadError, ValueError, AttributeError):
        raise SystemExit("The platform sent no environment for the server.") from None
    if not isinstance(environ, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        raise SystemExit("The platform sent a malformed environment for the server.")
    return environ


async def main_async(spec: dict, fd_in: int, fd_out: int) -> None:
    loop = asyncio.get_running_loop()
    shim = Shim(spec)
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd_in, "rb", 0))
    await shim.start(await read_environ(reader) if spec.get("environ") else None)
    writer, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(fd_out, "wb", 0))
    try:
        await serve(shim, reader, writer)
    finally:
        if shim.server is not None and shim.server.returncode is None:
            shim.server.send_signal(signal.SIGKILL)


def main() -> None:
    spec = json.loads(sys.argv[1])
    # The protocol moves off fds 0 and 1: the server's prints (and the shim's) go to stderr.
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    asyncio.run(main_async(spec, fd_in, fd_out))
    os._exit(0)


if __name__ == "__main__":
    main()
