"""Ids of tool calls: time-ordered, so the audit log's index on them grows at one end.

A call's id is the unique key of its row in episodes_toolcall. Random ids (uuid4) land anywhere in
that index, so every row written dirtied a leaf page of its own (on SQLite each a 4 KiB page
written to the WAL per commit); ids that begin with the time go in at the index's right edge, where
a batch of rows shares a page. The layout is UUIDv7's (RFC 9562: 48 bits of Unix milliseconds, then
74 random bits), as 32 hex digits like uuid4().hex: anything that parses a call id as a UUID still
can. The random bits come from the OS (os.urandom), as uuid4's do.
"""

from __future__ import annotations

import os
import time


def call_id() -> str:
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 of them kept
    value = (time.time_ns() // 1_000_000 & (1 << 48) - 1) << 80
    value |= 0x7 << 76  # version 7
    value |= (rand >> 68 & 0xFFF) << 64  # rand_a: 12 bits
    value |= 0b10 << 62  # the RFC variant
    value |= rand & (1 << 62) - 1  # rand_b: 62 bits
    return f"{value:032x}"
