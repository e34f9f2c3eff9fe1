"""What a supervisor accepts from a sandbox worker's channel (pool.py's reader), and its limits.

A worker is tenant code: it may write anything on its pipe. The supervisor keeps the channel
bounded: a frame answering no pending request, a frame that never ends, or one larger than any
answer may be, kills the worker; an answer larger than ORS_MAX_TOOL_OUTPUT_BYTES is never held
whole (its first ORS_AUDIT_TRUNCATED_BYTES are kept for the audit log and the rest is discarded
as it arrives) and ends its request with `ReplyTooLarge`. No Django here: runner nodes read the
same variables, with the same defaults, from their environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024

# Operator settings (environment variable -> default); settings.py reads the same names.
DEFAULTS: dict[str, Any] = {
    # An answer (tool output, prompt, task tools) larger than this ends its request with an error.
    "ORS_MAX_TOOL_OUTPUT_BYTES": 4 * MiB,
    # Any frame larger than this breaks the protocol: its worker is killed without reading it.
    "ORS_MAX_FRAME_BYTES": 64 * MiB,
    # A frame begun and not finished within this long kills its worker.
    "ORS_FRAME_DEADLINE_SECONDS": 10.0,
    # How much of an over-limit answer the audit log keeps.
    "ORS_AUDIT_TRUNCATED_BYTES": 64 * 1024,
}
# Frames larger than this are decoded on a thread, not on the event loop serving every session.
PARSE_OFF_LOOP_BYTES = 256 * 1024
# A reply's id, read from the start of a frame that is not decoded whole (the worker writes it first).
REPLY_ID = re.compile(rb'^\s*\{\s*"id"\s*:\s*(\d{1,18})\s*[,}]')


def channel_setting(name: str) -> Any:
    raw = os.environ.get(name)
    default = DEFAULTS[name]
    return default if raw is None or raw.strip() == "" else type(default)(raw)


# (name, default) -> value, installed by the Django side (executors/inline.py) in a process whose
# Django settings are configured; None reads the environment only.
settings_lookup: Callable[[str, Any], Any] | None = None


@dataclass(frozen=True)
class ChannelLimits:
    max_output: int
    max_frame: int
    deadline: float
    truncated: int

    @classmethod
    def current(cls) -> ChannelLimits:
        """The settings `settings_lookup` reads where the platform installed one (a gateway: Django's,
        read at each worker start, so settings overridden at run time apply), else the
        environment (a runner node). This package imports no Django: the Django side installs it."""
        values = {name: channel_setting(name) for name in DEFAULTS}
        if settings_lookup is not None:
            values = {name: settings_lookup(name, value) for name, value in values.items()}
        max_output = max(1024, int(values["ORS_MAX_TOOL_OUTPUT_BYTES"]))
        return cls(max_output=max_output, max_frame=max(max_output, int(values["ORS_MAX_FRAME_BYTES"])),
                   deadline=float(values["ORS_FRAME_DEADLINE_SECONDS"]),
                   truncated=min(max_output, max(0, int(values["ORS_AUDIT_TRUNCATED_BYTES"]))))


class ReplyTooLarge(Exception):
    """The worker's answer was larger than ORS_MAX_TOOL_OUTPUT_BYTES; `head` is its beginning
    (the frame's raw JSON text, cut), for the audit log only."""

    def __init__(self, size: int, limit: int, head: str) -> None:
        super().__init__(f"The environment's answer is {size:,} bytes, over the {limit:,}-byte limit "
                         "(ORS_MAX_TOOL_OUTPUT_BYTES).")
        self.size = size
        self.limit = limit
        self.head = head
