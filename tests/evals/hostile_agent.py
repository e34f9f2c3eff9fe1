"""A hostile AAP v1 agent server for the egress tests: raw HTTP/1.1 on asyncio streams, so that it can
send exactly the bytes a hostile agent would (far too many, or one at a time).

    python tests/evals/hostile_agent.py --port 8766 [--trickle-seconds 1]

The URL's path picks how GET <prefix>/meta misbehaves: `/meta` answers a valid /meta listing the
agents below; `/huge/meta` streams a 1 GB JSON document; `/declared/meta` declares a 1 GB
Content-Length; `/trickle/meta` sends its headers, then a byte every --trickle-seconds;
`/trickle-head/meta` trickles from the status line on; `/gzip/meta` answers compressed; `/deep/meta` nests 200,000 arrays.

The agent named in PUT /session picks how its first turn misbehaves: `huge-json` (stream "none": a
1 GB JSON reply), `huge-sse` (a stream of well-formed 64 KB text deltas, 1 GB in all),
`endless-line` (one SSE line that never ends), `huge-event` (one event of small data lines that
never ends), `trickle-turn` (a byte every --trickle-seconds, JSON or SSE). Every DELETE answers a
1 GB body. GET /_stats tells what was sent: bytes per behaviour, and requests seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

GB = 1 << 30
CHUNK = b"a" * (256 * 1024)
AGENTS = ["huge-json", "huge-sse", "endless-line", "huge-event", "trickle-turn"]
TRICKLE_SECONDS = 1.0
STATS: dict[str, int] = {}


def meta() -> dict:
    return {"version": 1, "agents": [
        {"name": name, "version": "1.0.0", "tools": [], "options": [],
         "capabilities": {"stream": {"delta": {}, "message": {}, "none": {}}, "application": {"tools": {}}}}
        for name in AGENTS]}


def count(key: str, n: int = 1) -> None:
    STATS[key] = STATS.get(key, 0) + n


async def send(writer: asyncio.StreamWriter, data: bytes, key: str) -> None:
    writer.write(data)
    await writer.drain()
    count(f"bytes:{key}", len(data))


def head(status: str, content_type: str, extra: str = "") -> bytes:
    # No Content-Length: the body ends when the connection closes (HTTP/1.1 allows it with close).
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nConnection: close\r\n{extra}\r\n".encode()


async def flood(writer: asyncio.StreamWriter, key: str, unit: bytes = CHUNK, total: int = GB) -> None:
    sent = 0
    while sent < total:
        await send(writer, unit, key)
        sent += len(unit)


async def trickle(writer: asyncio.StreamWriter, data: bytes, key: str) -> None:
    for i in range(len(data)):
        await send(writer, data[i:i + 1], key)
        await asyncio.sleep(TRICKLE_SECONDS)


def frame(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def get_meta(writer: asyncio.StreamWriter, prefix: str) -> None:
    body = json.dumps(meta()).encode()
    if prefix == "":
        await send(writer, head("200 OK", "application/json", f"Content-Length: {len(body)}\r\n") + body, "meta")
    elif prefix == "/huge":
        await send(writer, head("200 OK", "application/json") + b'{"version": 1, "agents": [], "x": "', "huge-meta")
        await flood(writer, "huge-meta")
    elif prefix == "/declared":
        await send(writer, head("200 OK", "application/json", f"Content-Length: {GB}\r\n"), "declared-meta")
        await flood(writer, "declared-meta")
    elif prefix == "/trickle":
        await send(writer, head("200 OK", "application/json"), "trickle-meta")
        await trickle(writer, body, "trickle-meta")
    elif prefix == "/trickle-head":
        await trickle(writer, head("200 OK", "application/json") + body, "trickle-head-meta")
    elif prefix == "/gzip":
        await send(writer, head("200 OK", "application/json", "Content-Encoding: gzip\r\n") + b"\x1f\x8b", "gzip-meta")
    elif prefix == "/deep":  # 200 KB, under every cap, nested past the JSON parser's recursion limit
        deep = b"[" * 200_000
        await send(writer, head("200 OK", "application/json", f"Content-Length: {len(deep)}\r\n") + deep, "deep-meta")
    else:
        await send(writer, head("404 Not Found", "text/plain") + b"no such meta", "404")


async def put_session(writer: asyncio.StreamWriter, body: dict) -> None:
    name = (body.get("agent") or {}).get("name")
    stream = body.get("stream") or "none"
    sid = f"sess_{uuid.uuid4().hex[:12]}"
    count(f"put:{name}:{stream}")
    sse = head("200 OK", "text/event-stream") + frame("session_start", {"sessionId": sid}) + frame("turn_start", {})
    if name == "huge-json":
        await send(writer, head("200 OK", "application/json") + json.dumps(
            {"sessionId": sid, "stopReason": "end_turn"})[:-1].encode() + b', "messages": [{"role": "assistant", '
            b'"content": "', name)
        await flood(writer, name)
    elif name == "huge-sse":
        await send(writer, sse, name)
        await flood(writer, name, frame("text_delta", {"delta": "a" * 65536}))
    elif name == "endless-line":
        await send(writer, sse + b"event: text\ndata: ", name)
        await flood(writer, name)
    elif name == "huge-event":
        await send(writer, sse + b"event: text\n", name)
        await flood(writer, name, b"data: " + b"a" * 1024 + b"\n")
    elif name == "trickle-turn":
        if stream == "none":
            await send(writer, head("200 OK", "application/json"), name)
            await trickle(writer, b" " * 100_000, name)
        else:
            await send(writer, sse, name)
            await trickle(writer, b":\n" * 50_000, name)
    else:
        await send(writer, head("404 Not Found", "text/plain") + b"no such agent", "404")


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await reader.readuntil(b"\r\n\r\n")
        lines = request.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        count(f"request:{method} {target}")
        path = target.split("?")[0]
        if method == "GET" and path.endswith("/meta"):
            await get_meta(writer, path.removesuffix("/meta"))
        elif method == "GET" and path == "/_stats":
            body = json.dumps(STATS).encode()
            writer.write(head("200 OK", "application/json", f"Content-Length: {len(body)}\r\n") + body)
        elif method == "PUT" and path == "/session":
            await put_session(writer, json.loads(raw or b"{}"))
        elif method == "DELETE" and path.startswith("/session/"):
            await send(writer, head("200 OK", "application/json"), "delete")
            await flood(writer, "delete")
        else:
            writer.write(head("404 Not Found", "text/plain") + b"not found")
    except (ConnectionError, asyncio.IncompleteReadError):
        count("client-hung-up")
    finally:
        writer.close()


async def main() -> None:
    global TRICKLE_SECONDS
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--trickle-seconds", type=float, default=1.0)
    args = parser.parse_args()
    TRICKLE_SECONDS = args.trickle_seconds
    server = await asyncio.start_server(handle, "127.0.0.1", args.port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
