"""Tool calls' ids (engine/ids.py): time-ordered, unique, and still UUIDs."""

from __future__ import annotations

import time
import uuid

from orsplatform.engine.ids import call_id


def test_call_ids_are_version_7_uuids_in_uuid4_hex_form():
    value = call_id()
    assert len(value) == 32 and int(value, 16) >= 0
    parsed = uuid.UUID(value)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert abs(int(value[:12], 16) - time.time_ns() // 1_000_000) < 60_000  # the leading 48 bits: now, in ms


def test_ids_made_later_sort_after_earlier_ones_and_none_repeat():
    first = [call_id() for _ in range(2000)]
    deadline = time.monotonic() + 5
    while call_id()[:12] == first[-1][:12] and time.monotonic() < deadline:  # the next millisecond
        pass
    later = [call_id() for _ in range(2000)]
    assert max(first) < min(later)
    assert len(set(first + later)) == 4000
