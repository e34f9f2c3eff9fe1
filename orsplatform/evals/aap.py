"""The application side of the Agent Application Protocol, versions 1 to 3 (spec/aap-v1-endpoints.md,
spec/aap-v1-wire.md, spec/aap-versions.md): /meta discovery, then each agent spoken to in the version
its /meta declares (evals/aap_versions.py holds what differs): create a session, send turns, delete
it, in the three response modes (JSON for "none", SSE for "message" and "delta").

No Python implementation of AAP exists; this one is httpx for HTTP (over the egress policy's
transport, evals/egress.py) and a bounded SSE reader of its own: httpx-sse reads a line whole
however long it grows. Replies are read within byte caps and calls within deadlines
(docs/agent-egress.md). Every way an agent can misbehave ends as an ``AapError`` whose text is the
episode's reason.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from orsplatform.evals import aap_versions, egress

STOP_REASONS = frozenset({"end_turn", "tool_use", "max_tokens", "refusal", "error"})
STREAM_MODES = ("none", "message", "delta")
# An agent's text kept in a transcript, per block: enough to read, bounded so a chatty agent
# cannot grow one row without limit.
MAX_TRANSCRIPT_TEXT = 20_000
# Of an error reply, only this much is read: enough for the reason, whatever the agent sends.
MAX_ERROR_BYTES = 4096
# Compressed replies are refused rather than inflated: a small gzip body can inflate a
# thousandfold, past every byte cap below.
IDENTITY = {"Accept-Encoding": "identity"}
STREAM_CUT = ("Agent fault: the agent's event stream ended without its final event (turn_stop), so the turn's "
              "outcome is unknown. Some agent servers (the AAP TypeScript SDK's, 0.8.0) close streamed turns "
              'before their last events; register this agent with stream "none".')


class AapError(Exception):
    """The agent failed the turn (unreachable, timed out, 4xx/5xx, malformed reply)."""


class UrlNotAllowed(AapError):
    """The agent's URL points where the operator does not let the platform connect."""


# --- where agents may live (SSRF) -------------------------------------------------------------------

def check_url(url: str) -> None:
    """Refuse agent URLs the egress policy (evals/egress.py) would not connect to: outside
    ORS_EVAL_AGENT_ALLOWED_HOSTS (host or IP range, and port), or, without an allow-list, any host
    with a non-public address. A clear early answer at registration and when a run starts; every
    connection is judged again on the address it is opened to."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # "http://[::1"
        host = None
    if host is None or parts.scheme not in ("http", "https"):
        raise UrlNotAllowed("The agent URL must be an http:// or https:// URL with a host.")
    try:
        port = parts.port
    except ValueError:
        port = 0
    port = (443 if parts.scheme == "https" else 80) if port is None else port
    if not 0 < port < 65536:
        raise UrlNotAllowed("The agent URL has a port that is not a number from 1 to 65535.")
    try:
        egress.admit(host, port, settings.ORS_EVAL_AGENT_ALLOWED_HOSTS)
    except egress.EgressRefused as exc:
        raise UrlNotAllowed(str(exc)) from None


def _endpoint(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _brief(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


# --- reading replies within their caps ---------------------------------------------------------------
# An agent's reply is read as it arrives and counted; past its cap the platform stops reading and the
# call fails, so a reply of any size costs at most its cap in memory.

def _size(n: int) -> str:
    return f"{n / 1048576:g} MiB" if n >= 1048576 and n % 1024 == 0 else f"{n} bytes"


def _too_big(what: str, limit: int, setting: str) -> AapError:
    return AapError(f"{what} was larger than {_size(limit)} ({setting}); the platform stopped reading it.")


def _check_reply(response: httpx.Response, what: str, limit: int, setting: str) -> None:
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise AapError(f"{what} came compressed (Content-Encoding: {_brief(encoding, 40)}); the platform asks for "
                       "identity and does not inflate replies.")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_big(what, limit, setting)


def _read_capped(response: httpx.Response, what: str, limit: int, setting: str) -> bytes:
    _check_reply(response, what, limit, setting)
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) > limit:
            raise _too_big(what, limit, setting)
    return bytes(body)


async def _aread_capped(response: httpx.Response, what: str, limit: int, setting: str) -> bytes:
    _check_reply(response, what, limit, setting)
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            raise _too_big(what, limit, setting)
    return bytes(body)


def _error_text(chunks: Iterator[bytes] | list[bytes]) -> str:
    return _brief(b"".join(chunks)[:MAX_ERROR_BYTES].decode("utf-8", "replace"))


def _read_error(response: httpx.Response) -> str:
    chunks, size = [], 0
    for chunk in response.iter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BYTES:
            break
    return _error_text(chunks)


async def _aread_error(response: httpx.Response) -> str:
    chunks, size = [], 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BYTES:
            break
    return _error_text(chunks)


@dataclass
class Event:
    event: str
    data: str


class EventReader:
    """Server-sent events from raw bytes, framed as the WHATWG rules (and httpx-sse) frame them, with
    caps on one line, one event and the whole stream: an endless line or event ends the turn
    instead of growing a buffer."""

    _EOL = re.compile(rb"\r\n|\r|\n")

    def __init__(self, *, max_line: int, max_event: int, max_total: int) -> None:
        self.max_line, self.max_event, self.max_total = max_line, max_event, max_total
        self.buffer = bytearray()
        self.scan = 0  # where the next search for a line end starts: the pending line was searched up to it
        self.total = 0
        self.event = ""
        self.data: list[str] = []
        self.event_bytes = 0

    def feed(self, chunk: bytes) -> list[Event]:
        self.total += len(chunk)
        if self.total > self.max_total:
            raise _too_big("The agent's turn", self.max_total, "ORS_EVAL_MAX_TURN_BYTES")
        self.buffer += chunk
        events: list[Event] = []
        pos = 0
        while True:
            match = self._EOL.search(self.buffer, max(pos, self.scan))
            # A final "\r" may be the first half of "\r\n": wait for the next byte.
            if match is None or (match.group() == b"\r" and match.end() == len(self.buffer)):
                break
            self._line(self.buffer[pos:match.start()], events)
            pos = self.scan = match.end()
        del self.buffer[:pos]
        self.scan = max(0, len(self.buffer) - 1)
        if len(self.buffer) > self.max_line:
            raise _too_big("A line of the agent's event stream", self.max_line, "ORS_EVAL_MAX_SSE_LINE_BYTES")
        return events

    def _line(self, raw: bytearray, events: list[Event]) -> None:
        if len(raw) > self.max_line:
            raise _too_big("A line of the agent's event stream", self.max_line, "ORS_EVAL_MAX_SSE_LINE_BYTES")
        self.event_bytes += len(raw) + 1
        if self.event_bytes > self.max_event:
            raise _too_big("An event of the agent's stream", self.max_event, "ORS_EVAL_MAX_EVENT_BYTES")
        line = raw.decode("utf-8", "replace")
        if not line:
            if self.event or self.data:
                events.append(Event(self.event or "message", "\n".join(self.data)))
            self.event, self.data, self.event_bytes = "", [], 0
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                self.event = value
            elif name == "data":
                self.data.append(value)
            # id and retry mean nothing to a turn, which is never resumed.


# --- discovery ---------------------------------------------------------------------------------------

def fetch_meta(url: str, api_key: str, agent: str) -> dict[str, Any]:
    """The /meta entry of `agent` on the server at `url` (AAP version 1, 2 or 3), plus the server's
    version as `protocol_version` (what the platform then speaks to it).
    Raises AapError with a sentence for the API's 400. The whole call ends within
    ORS_EVAL_META_TIMEOUT_SECONDS and reads at most ORS_EVAL_MAX_META_BYTES, so a trickling or
    endless /meta holds the calling thread (a web request's) no longer than that."""
    check_url(url)
    seconds = settings.ORS_EVAL_META_TIMEOUT_SECONDS
    end = time.monotonic() + seconds
    try:
        with egress.deadline(seconds), httpx.Client(
                transport=egress.transport(), trust_env=False, follow_redirects=False,
                timeout=settings.ORS_EVAL_CONNECT_TIMEOUT_SECONDS) as client:
            with client.stream("GET", _endpoint(url, "/meta"), headers={**_headers(api_key), **IDENTITY}) as response:
                if response.status_code != 200:
                    raise AapError(f"GET /meta answered {response.status_code}: {_read_error(response)}")
                body = _read_capped(response, "GET /meta", settings.ORS_EVAL_MAX_META_BYTES,
                                    "ORS_EVAL_MAX_META_BYTES")
    except egress.EgressRefused as exc:
        raise UrlNotAllowed(str(exc)) from None
    except httpx.TimeoutException as exc:
        # A read clamped to the deadline ends at it (the clock's rounding aside).
        if time.monotonic() >= end - 0.05:
            raise AapError(f"GET /meta did not finish within {seconds:g} s (ORS_EVAL_META_TIMEOUT_SECONDS).") from None
        raise AapError(f"GET /meta failed: {type(exc).__name__}: {exc}") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise AapError(f"GET /meta failed: {type(exc).__name__}: {_brief(str(exc))}") from None
    try:
        meta = json.loads(body)
    except (ValueError, RecursionError):  # too deep: under the caps, still not JSON
        raise AapError("GET /meta did not answer JSON.") from None
    version = meta.get("version") if isinstance(meta, dict) else None
    if not aap_versions.supported(version):
        known = ", ".join(map(str, aap_versions.VERSIONS))
        raise AapError(f"The server speaks AAP version {_brief(repr(version), 40)}; the platform speaks versions "
                       f"{known}.")
    agents = meta.get("agents") if isinstance(meta.get("agents"), list) else []
    for entry in agents:
        if isinstance(entry, dict) and entry.get("name") == agent:
            return {**entry, "protocol_version": version}
    names = [a.get("name") for a in agents if isinstance(a, dict)]
    raise AapError(f"The server has no agent named {agent!r} (it has: {', '.join(map(str, names)) or 'none'}).")


def stream_modes(meta: dict[str, Any]) -> list[str]:
    """The stream modes /meta declares; without `capabilities.stream`, only "none"."""
    stream = (meta.get("capabilities") or {}).get("stream")
    if not isinstance(stream, dict):
        return ["none"]
    return [mode for mode in STREAM_MODES if mode in stream]


# --- a turn ------------------------------------------------------------------------------------------

@dataclass
class ToolUse:
    id: str
    name: str
    input: dict


@dataclass
class Turn:
    """What the agent said in one turn: its content blocks in order, and how the turn stopped."""

    stop_reason: str
    session_id: str | None = None
    blocks: list[dict] = field(default_factory=list)
    tool_uses: list[ToolUse] = field(default_factory=list)
    server_results: list[dict] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None

    # The text of the last block while deltas extend it, joined once when the block is done: adding
    # to a string in place would copy it on every delta (quadratic in a long streamed turn).
    _run: list[str] | None = field(default=None, repr=False)

    def add_text(self, kind: str, text: str, *, merge: bool) -> None:
        if merge and self.blocks and self.blocks[-1]["type"] == kind:
            if self._run is None:
                self._run = [self.blocks[-1][kind]]
            self._run.append(text)
            return
        self.close()
        self.blocks.append({"type": kind, kind: text})

    def close(self) -> None:
        """Finish the last block's text (after the turn's last delta, and before another block)."""
        if self._run is not None:
            kind = self.blocks[-1]["type"]
            self.blocks[-1][kind] = "".join(self._run)
            self._run = None

    def add_tool_use(self, data: dict) -> None:
        call_id, name, tool_input = data.get("toolCallId"), data.get("name"), data.get("input", {})
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(tool_input, dict):
            raise AapError(f"Malformed tool call from the agent: {_brief(json.dumps(data, default=str))}")
        self.close()
        self.tool_uses.append(ToolUse(id=call_id, name=name, input=tool_input))
        self.blocks.append({"type": "tool_use", "toolCallId": call_id, "name": name, "input": tool_input})

    def note_usage(self, meta: Any) -> None:
        usage = meta.get("usage") if isinstance(meta, dict) else None
        if not isinstance(usage, dict):
            return
        for attr, keys in (("input_tokens", ("inputTokens", "input_tokens")),
                           ("output_tokens", ("outputTokens", "output_tokens"))):
            for key in keys:
                if isinstance(usage.get(key), int) and usage[key] >= 0:
                    setattr(self, attr, usage[key])
                    break


def _stop_reason(value: Any) -> str:
    if value not in STOP_REASONS:
        raise AapError(f"Malformed reply: unknown stopReason {value!r}.")
    return value


class AapClient:
    """One agent endpoint, over a shared httpx.AsyncClient (its connection pool), in the AAP
    version its /meta declared."""

    def __init__(self, http: httpx.AsyncClient, *, url: str, api_key: str, stream: str,
                 turn_timeout: float, version: int = 1) -> None:
        self.http = http
        self.url = url
        self.headers = _headers(api_key)
        self.stream = stream
        self.turn_timeout = turn_timeout
        self.version = version

    async def create(self, body: dict, on_session: Callable[[str], None] | None = None) -> Turn:
        """Create the agent's session and run its first turn on `body["messages"]`. `on_session`
        learns the new session's id as soon as the agent tells it (v1/v2: session_start, before
        the turn ends, in the stream modes; v3: the reply of POST /sessions, before the turn):
        whoever cancels the turn can still delete the session."""
        if not aap_versions.creates_apart(self.version):
            turn = await self._turn("PUT", "/session", body, on_session, creating=True)
            if not turn.session_id:
                raise AapError("Malformed reply: no sessionId for the new session.")
            return turn
        session_id = await self._open({k: body[k] for k in ("agent", "tools") if k in body})
        if on_session is not None:
            on_session(session_id)
        turn = await self.send(session_id, {"messages": body.get("messages") or []})
        turn.session_id = session_id
        return turn

    async def send(self, session_id: str, body: dict) -> Turn:
        return await self._turn("POST", aap_versions.turn_path(self.version, session_id), body)

    async def delete(self, session_id: str) -> None:
        # Best effort, bounded: the episode's score does not depend on the agent's clean-up, and the
        # reply's body is never read (its status is all there is to know).
        try:
            async with asyncio.timeout(settings.ORS_EVAL_CONNECT_TIMEOUT_SECONDS):
                async with self.http.stream("DELETE",
                                            _endpoint(self.url, aap_versions.session_path(self.version, session_id)),
                                            headers={**self.headers, **IDENTITY}):
                    pass
        except (httpx.HTTPError, httpx.InvalidURL, TimeoutError, egress.EgressRefused):
            pass

    async def _open(self, body: dict) -> str:
        """v3's POST /sessions: 201 with the new session's id, no turn run."""
        async def read(response: httpx.Response) -> str:
            raw = await _aread_capped(response, "The reply of POST /sessions", settings.ORS_EVAL_MAX_TURN_BYTES,
                                      "ORS_EVAL_MAX_TURN_BYTES")
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError):
                raise AapError(f"Malformed reply to POST /sessions: not JSON: {_error_text([raw])}") from None
            session_id = data.get("sessionId") if isinstance(data, dict) else None
            if not isinstance(session_id, str) or not session_id:
                raise AapError("Malformed reply: no sessionId for the new session.")
            return session_id

        return await self._exchange("POST", "/sessions", body, {**self.headers, **IDENTITY}, read, creating=True)

    async def _turn(self, method: str, path: str, body: dict,
                    on_session: Callable[[str], None] | None = None, *, creating: bool = False) -> Turn:
        body = {**body, "stream": self.stream}
        headers = {**self.headers, **IDENTITY}
        if self.stream != "none":
            headers.update({"Accept": "text/event-stream", "Cache-Control": "no-store"})

        async def read(response: httpx.Response) -> Turn:
            if self.stream == "none":
                raw = await _aread_capped(response, "The agent's turn", settings.ORS_EVAL_MAX_TURN_BYTES,
                                          "ORS_EVAL_MAX_TURN_BYTES")
                return self._json_turn(raw, on_session)
            return await self._sse_turn(response, on_session)

        return await self._exchange(method, path, body, headers, read, creating=creating)

    async def _exchange(self, method: str, path: str, body: dict, headers: dict[str, str],
                        read: Callable[[httpx.Response], Any], *, creating: bool = False) -> Any:
        """One call to the agent within the turn's deadline; every failure an AapError."""
        try:
            async with asyncio.timeout(self.turn_timeout):
                async with self.http.stream(method, _endpoint(self.url, path), json=body, headers=headers) as response:
                    if response.status_code >= 400:
                        hint = ""
                        if creating and response.status_code in (404, 405):
                            # The likeliest cause: the server moved to another AAP version since /meta
                            # was read; the agent keeps the version it was registered (or pinged) with.
                            hint = (f" ({method} {path} is AAP version {self.version}'s; if the agent's server "
                                    "now speaks another version, ping its /meta.)")
                        raise AapError(f"Agent answered HTTP {response.status_code}: "
                                       f"{await _aread_error(response)}{hint}")
                    return await read(response)
        except TimeoutError:
            raise AapError(f"Agent timed out: the turn did not end within {self.turn_timeout:g} s.") from None
        except egress.EgressRefused as exc:
            raise UrlNotAllowed(str(exc)) from None
        except httpx.TimeoutException as exc:
            raise AapError(f"Agent timed out ({type(exc).__name__}).") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise AapError(f"Agent unreachable: {type(exc).__name__}: {_brief(str(exc))}") from None

    def _json_turn(self, raw: bytes, on_session: Callable[[str], None] | None = None) -> Turn:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):  # too deep: under the caps, still not JSON
            raise AapError(f"Malformed reply: not JSON: {_error_text([raw])}") from None
        told = data.get("sessionId") if isinstance(data, dict) else None
        if on_session is not None and told and isinstance(told, str):
            on_session(told)  # before the rest is checked: a malformed reply's session is deleted too
        if not isinstance(data, dict) or not isinstance(data.get("messages", []), list):
            raise AapError("Malformed reply: expected an object with stopReason and messages.")
        turn = Turn(stop_reason=_stop_reason(data.get("stopReason")), session_id=data.get("sessionId"))
        turn.note_usage(data.get("_meta"))
        for message in data.get("messages", []):
            if not isinstance(message, dict):
                raise AapError("Malformed reply: a message is not an object.")
            role, content = message.get("role"), message.get("content")
            if role == "tool":  # a trusted server-side tool's result
                turn.server_results.append({"toolCallId": message.get("toolCallId"), "content": content})
                continue
            if role != "assistant":
                continue
            if isinstance(content, str):
                turn.add_text("text", content, merge=False)
                continue
            if not isinstance(content, list):
                raise AapError("Malformed reply: assistant content must be a string or blocks.")
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind in ("text", "thinking") and isinstance(block.get(kind), str):
                    turn.add_text(kind, block[kind], merge=False)
                elif kind == "tool_use":
                    turn.add_tool_use(block)
                elif kind == "image":
                    turn.blocks.append({"type": "image", "mimeType": block.get("mimeType")
                                        or aap_versions.mime_of_url(block.get("url"))})
        return turn

    async def _events(self, response: httpx.Response) -> AsyncIterator[Event]:
        content_type = response.headers.get("content-type", "").partition(";")[0]
        if "text/event-stream" not in content_type:
            raise AapError("Malformed SSE: Expected response header Content-Type to contain 'text/event-stream', "
                           f"got {_brief(content_type, 80)!r}")
        _check_reply(response, "The agent's turn", settings.ORS_EVAL_MAX_TURN_BYTES, "ORS_EVAL_MAX_TURN_BYTES")
        reader = EventReader(max_line=settings.ORS_EVAL_MAX_SSE_LINE_BYTES,
                             max_event=settings.ORS_EVAL_MAX_EVENT_BYTES, max_total=settings.ORS_EVAL_MAX_TURN_BYTES)
        async for chunk in response.aiter_raw():
            for event in reader.feed(chunk):
                yield event

    async def _sse_turn(self, response: httpx.Response, on_session: Callable[[str], None] | None = None) -> Turn:
        session_id: str | None = None
        pending = Turn(stop_reason="")
        events = self._events(response)
        try:
            async for sse in events:
                try:
                    data = json.loads(sse.data) if sse.data else {}
                except (ValueError, RecursionError):  # too deep: under the caps, still not JSON
                    raise AapError(f"Malformed SSE: {sse.event!r} data is not JSON: {_brief(sse.data)}") from None
                if not isinstance(data, dict):
                    raise AapError(f"Malformed SSE: {sse.event!r} data is not an object.")
                event = sse.event
                if event == "session_start":
                    session_id = data.get("sessionId")
                    if on_session is not None and isinstance(session_id, str) and session_id:
                        on_session(session_id)
                elif event == "text_delta" or event == "thinking_delta":
                    pending.add_text(event.removesuffix("_delta"), str(data.get("delta", "")), merge=True)
                elif event == "text":
                    pending.add_text("text", str(data.get("text", "")), merge=False)
                elif event == "thinking":
                    pending.add_text("thinking", str(data.get("thinking", "")), merge=False)
                elif event == "tool_call":
                    pending.add_tool_use(data)
                elif event == "tool_result":
                    pending.server_results.append({"toolCallId": data.get("toolCallId"), "content": data.get("content")})
                elif event == "turn_stop":
                    pending.stop_reason = _stop_reason(data.get("stopReason"))
                    pending.note_usage(data.get("_meta"))
                    pending.close()
                    pending.session_id = session_id
                    return pending
                # turn_start and events of later versions carry nothing the application needs.
        finally:
            await events.aclose()
        # An agent fault, named as such: the AAP TypeScript SDK's server (0.8.0) writes its events
        # without awaiting them and can close a streamed turn before its last ones.
        raise AapError(STREAM_CUT)


# --- transcripts -------------------------------------------------------------------------------------

def for_transcript(blocks: list[dict]) -> list[dict]:
    """Blocks as a transcript keeps them: long text cut, images reduced to their type."""
    out = []
    for block in blocks:
        kind = block.get("type")
        if kind in ("text", "thinking"):
            text = block.get(kind) or ""
            out.append({"type": kind, kind: text if len(text) <= MAX_TRANSCRIPT_TEXT
                        else text[:MAX_TRANSCRIPT_TEXT] + "…"})
        elif kind == "image":
            out.append({"type": "image", "mimeType": block.get("mimeType")})
        else:
            out.append(block)
    return out
