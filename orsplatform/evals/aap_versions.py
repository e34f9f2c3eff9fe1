"""What differs between AAP versions 1 to 3 (spec/aap-versions.md), in one place: the paths of a
session's endpoints, whether creating a session runs a turn, and the shapes of tool specs and image
blocks the platform sends. The platform speaks to each agent the version its /meta declares.

- v1: `PUT /session` runs the first turn (SSE starts with `session_start`), `POST /session/:id`,
  `DELETE /session/:id`; tool specs with `inputSchema`; images `{mimeType, data}`.
- v2 (SDK 0.6): the same session endpoints (it changed only listing and history, which the platform
  does not read); images `{url}`.
- v3 (SDK 0.7-0.8): `POST /sessions` creates and runs nothing (201 `{sessionId}`),
  `POST /sessions/:id/turns`, `DELETE /sessions/:id`; no `session_start`; tool specs with
  `parameters`; images `{url}` (`data:` or `https:`).

Sent shapes carry the newer spelling always and the older one alongside where that version reads it
(`parameters` and `inputSchema`, `url` and `mimeType`/`data`), so one conversion serves every version
and a v1 agent that already reads `url` (SDK >= 0.2) finds it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

VERSIONS = (1, 2, 3)


def supported(version: Any) -> bool:
    return type(version) is int and version in VERSIONS


def creates_apart(version: int) -> bool:
    """Whether creating a session is a call of its own that runs no turn (v3)."""
    return version >= 3


def create_path(version: int) -> tuple[str, str]:
    return ("POST", "/sessions") if version >= 3 else ("PUT", "/session")


# A session id is the agent's text: quoted whole, so it stays one path segment of the agent's URL.

def turn_path(version: int, session_id: str) -> str:
    sid = quote(session_id, safe="")
    return f"/sessions/{sid}/turns" if version >= 3 else f"/session/{sid}"


def session_path(version: int, session_id: str) -> str:
    sid = quote(session_id, safe="")
    return f"/sessions/{sid}" if version >= 3 else f"/session/{sid}"


def data_url(mime_type: str, data: str) -> str:
    return f"data:{mime_type};base64,{data}"


def mime_of_url(url: Any) -> str | None:
    """The media type of a `data:` URL (an agent's image block), else None."""
    if isinstance(url, str) and url.startswith("data:"):
        return url[5:].partition(",")[0].partition(";")[0] or None
    return None


def ors_blocks_to_aap(blocks: list[dict], version: int) -> list[dict]:
    """ORS text and image blocks as the agent's version spells them: an image as a `data:` URL,
    with v1's `mimeType` and `data` alongside for v1 agents (v2 and v3 SDK agents read `url` and
    reject what they do not expect)."""
    out: list[dict] = []
    for block in blocks or []:
        if block.get("type") == "text":
            out.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "image":
            mime = block.get("mimeType") or block.get("mime_type") or "image/png"
            data = block.get("data", "")
            image = {"type": "image", "url": data_url(mime, data)}
            if version < 2:
                image.update(mimeType=mime, data=data)
            out.append(image)
    return out


def ors_tools_to_aap(tools: list[dict], version: int) -> list[dict]:
    """The environment's tools as application-side tool specs: `parameters` (v3's name), and
    `inputSchema` too for v1 and v2 agents, which read that one."""
    out = []
    for tool in tools:
        schema = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object"}
        spec = {"name": tool["name"], "description": tool.get("description") or tool["name"], "parameters": schema}
        if version < 3:
            spec["inputSchema"] = schema
        out.append(spec)
    return out
