"""The application side of the Agent Application Protocol, version 1 (spec/aap-v1-endpoints.md,
spec/aap-v1-wire.md): /meta discovery, PUT /session, POST /session/:id, DELETE /session/:id, in the
three response modes (JSON for "none", SSE for "message" and "delta").

No Python implementation of AAP exists; this one is httpx for HTTP and httpx-sse for the event
stream. Every way an agent can misbehave ends as an ``AapError`` whose text is the episode's reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from httpx_sse import SSEError, aconnect_sse

PROTOCOL_VERSION = 1
STOP_REASONS = frozenset({"end_turn", "tool_use", "max_tokens", "refusal", "error"})
STREAM_MODES = ("none", "message", "delta")
# An agent's text kept in a transcript, per block: enough to read, bounded so a chatty agent
# cannot grow one row without limit.
MAX_TRANSCRIPT_TEXT = 20_000


class AapError(Exception):
    """The agent failed the turn (unreachable, timed out, 4xx/5xx, malformed reply)."""


class UrlNotAllowed(AapError):
    """The agent's URL points where the operator does not let the platform connect."""


# --- where agents may live (SSRF) -------------------------------------------------------------------

def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise UrlNotAllowed(f"The agent's host {host!r} does not resolve ({exc}).") from None
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def check_url(url: str) -> None:
    """Refuse agent URLs outside ORS_EVAL_AGENT_ALLOWED_HOSTS (hostnames and CIDR ranges); with no
    allow-list, refuse any host with a non-public address (loopback, private, link-local, metadata
    services). Checked at registration and again when a run starts (DNS may have changed)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlNotAllowed("The agent URL must be an http:// or https:// URL with a host.")
    host = parts.hostname.lower()
    allowed = settings.ORS_EVAL_AGENT_ALLOWED_HOSTS
    if allowed:
        if host in {a.lower() for a in allowed}:
            return
        networks = []
        for entry in allowed:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                continue  # a hostname entry
        addresses = _addresses(host)
        if addresses and all(any(a in n for n in networks) for a in addresses):
            return
        raise UrlNotAllowed(f"The agent's host {host!r} is not in ORS_EVAL_AGENT_ALLOWED_HOSTS.")
    if not all(a.is_global for a in _addresses(host)):
        raise UrlNotAllowed(f"The agent's host {host!r} has a non-public address; the operator may allow it "
                            "with ORS_EVAL_AGENT_ALLOWED_HOSTS.")


def _endpoint(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _brief(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


# --- discovery ---------------------------------------------------------------------------------------

def fetch_meta(url: str, api_key: str, agent: str) -> dict[str, Any]:
    """The /meta entry of `agent` on the server at `url` (version 1 only), plus the server's version.
    Raises AapError with a sentence for the API's 400."""
    check_url(url)
    try:
        response = httpx.get(_endpoint(url, "/meta"), headers=_headers(api_key),
                             timeout=settings.ORS_EVAL_CONNECT_TIMEOUT_SECONDS, follow_redirects=False)
    except httpx.HTTPError as exc:
        raise AapError(f"GET /meta failed: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise AapError(f"GET /meta answered {response.status_code}: {_brief(response.text)}")
    try:
        meta = response.json()
    except ValueError:
        raise AapError("GET /meta did not answer JSON.") from None
    if not isinstance(meta, dict) or meta.get("version") != PROTOCOL_VERSION:
        version = meta.get("version") if isinstance(meta, dict) else None
        raise AapError(f"The server speaks AAP version {version!r}; only version {PROTOCOL_VERSION} is supported.")
    agents = meta.get("agents") if isinstance(meta.get("agents"), list) else []
    for entry in agents:
        if isinstance(entry, dict) and entry.get("name") == agent:
            return {**entry, "protocol_version": PROTOCOL_VERSION}
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

    def add_text(self, kind: str, text: str, *, merge: bool) -> None:
        if merge and self.blocks and self.blocks[-1]["type"] == kind:
            self.blocks[-1][kind] += text
        else:
            self.blocks.append({"type": kind, kind: text})

    def add_tool_use(self, data: dict) -> None:
        call_id, name, tool_input = data.get("toolCallId"), data.get("name"), data.get("input", {})
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(tool_input, dict):
            raise AapError(f"Malformed tool call from the agent: {_brief(json.dumps(data, default=str))}")
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
    """One agent endpoint, over a shared httpx.AsyncClient (its connection pool)."""

    def __init__(self, http: httpx.AsyncClient, *, url: str, api_key: str, stream: str,
                 turn_timeout: float) -> None:
        self.http = http
        self.url = url
        self.headers = _headers(api_key)
        self.stream = stream
        self.turn_timeout = turn_timeout

    async def create(self, body: dict, on_session: Callable[[str], None] | None = None) -> Turn:
        """PUT /session. `on_session` learns the new session's id as soon as the agent tells it
        (session_start, before the turn ends, in the stream modes): whoever cancels the turn can
        still delete the session."""
        turn = await self._turn("PUT", "/session", body, on_session)
        if not turn.session_id:
            raise AapError("Malformed reply: no sessionId for the new session.")
        return turn

    async def send(self, session_id: str, body: dict) -> Turn:
        return await self._turn("POST", f"/session/{session_id}", body)

    async def delete(self, session_id: str) -> None:
        # Best effort, bounded: the episode's score does not depend on the agent's clean-up.
        try:
            async with asyncio.timeout(settings.ORS_EVAL_CONNECT_TIMEOUT_SECONDS):
                await self.http.delete(_endpoint(self.url, f"/session/{session_id}"), headers=self.headers)
        except (httpx.HTTPError, TimeoutError):
            pass

    async def _turn(self, method: str, path: str, body: dict,
                    on_session: Callable[[str], None] | None = None) -> Turn:
        body = {**body, "stream": self.stream}
        try:
            async with asyncio.timeout(self.turn_timeout):
                if self.stream == "none":
                    return await self._json_turn(method, path, body, on_session)
                return await self._sse_turn(method, path, body, on_session)
        except TimeoutError:
            raise AapError(f"Agent timed out: the turn did not end within {self.turn_timeout:g} s.") from None
        except httpx.TimeoutException as exc:
            raise AapError(f"Agent timed out ({type(exc).__name__}).") from None
        except httpx.HTTPError as exc:
            raise AapError(f"Agent unreachable: {type(exc).__name__}: {_brief(str(exc))}") from None

    async def _json_turn(self, method: str, path: str, body: dict,
                         on_session: Callable[[str], None] | None = None) -> Turn:
        response = await self.http.request(method, _endpoint(self.url, path), json=body, headers=self.headers)
        if response.status_code >= 400:
            raise AapError(f"Agent answered HTTP {response.status_code}: {_brief(response.text)}")
        try:
            data = response.json()
        except ValueError:
            raise AapError(f"Malformed reply: not JSON: {_brief(response.text)}") from None
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
                    turn.blocks.append({"type": "image", "mimeType": block.get("mimeType")})
        return turn

    async def _sse_turn(self, method: str, path: str, body: dict,
                        on_session: Callable[[str], None] | None = None) -> Turn:
        turn: Turn | None = None
        session_id: str | None = None
        pending = Turn(stop_reason="")
        async with aconnect_sse(self.http, method, _endpoint(self.url, path), json=body,
                                headers=self.headers) as source:
            response = source.response
            if response.status_code >= 400:
                await response.aread()
                raise AapError(f"Agent answered HTTP {response.status_code}: {_brief(response.text)}")
            try:
                async for sse in source.aiter_sse():
                    try:
                        data = json.loads(sse.data) if sse.data else {}
                    except ValueError:
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
                        pending.server_results.append(
                            {"toolCallId": data.get("toolCallId"), "content": data.get("content")})
                    elif event == "turn_stop":
                        pending.stop_reason = _stop_reason(data.get("stopReason"))
                        pending.note_usage(data.get("_meta"))
                        turn = pending
                        break
                    # turn_start and events of later versions carry nothing the application needs.
            except SSEError as exc:
                raise AapError(f"Malformed SSE: {exc}") from None
        if turn is None:
            raise AapError("Malformed SSE: the stream ended without turn_stop.")
        turn.session_id = session_id
        return turn


# --- ORS <-> AAP content ---------------------------------------------------------------------------

def ors_blocks_to_aap(blocks: list[dict]) -> list[dict]:
    """ORS text and image blocks as AAP content blocks (the same two shapes, other spellings aside)."""
    out: list[dict] = []
    for block in blocks or []:
        if block.get("type") == "text":
            out.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "image":
            out.append({"type": "image", "mimeType": block.get("mimeType") or block.get("mime_type") or "image/png",
                        "data": block.get("data", "")})
    return out


def ors_tools_to_aap(tools: list[dict]) -> list[dict]:
    return [{"name": t["name"], "description": t.get("description") or t["name"],
             "inputSchema": t.get("input_schema") or t.get("inputSchema") or {"type": "object"}}
            for t in tools]


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
