"""The bounded SSE reader of the AAP client: framed like the WHATWG rules (any line ending, split
anywhere between chunks), and capped per line, per event and per stream."""

from __future__ import annotations

import pytest

from orsplatform.evals.aap import AapError, Event, EventReader

STREAM = (b"event: session_start\r\ndata: {\"sessionId\": \"s\"}\r\n\r\n: a comment\n"
          b"event: text\rdata: line one\rdata:line two\r\r"
          b"data: {\"x\": 1}\n\n"
          b"event: turn_stop\ndata: {}\n\n"
          b"event: never_dispatched\ndata: no blank line after")
EVENTS = [Event("session_start", '{"sessionId": "s"}'), Event("text", "line one\nline two"),
          Event("message", '{"x": 1}'), Event("turn_stop", "{}")]


def _read(chunks: list[bytes], **caps: int) -> list[Event]:
    reader = EventReader(**{"max_line": 1 << 20, "max_event": 1 << 20, "max_total": 1 << 20, **caps})
    return [event for chunk in chunks for event in reader.feed(chunk)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
def test_events_are_the_same_however_the_stream_is_cut(size):
    assert _read([STREAM[i:i + size] for i in range(0, len(STREAM), size)]) == EVENTS


def test_a_line_past_its_cap_fails_before_its_end_arrives():
    with pytest.raises(AapError, match="A line of the agent's event stream was larger than 100 bytes"):
        _read([b"data: ", b"a" * 60, b"a" * 60], max_line=100)


def test_an_event_past_its_cap_fails_however_short_its_lines():
    with pytest.raises(AapError, match=r"An event of the agent's stream was larger than 1000 bytes \(ORS_EVAL_MAX_EVENT"):
        _read([b"event: text\n"] + [b"data: abcdefgh\n"] * 100, max_event=1000)


def test_a_stream_past_its_cap_fails_however_well_formed():
    frame = b"event: text_delta\ndata: {\"delta\": \"abc\"}\n\n"
    assert len(_read([frame] * 10, max_total=len(frame) * 10)) == 10
    with pytest.raises(AapError, match=r"The agent's turn was larger than .* \(ORS_EVAL_MAX_TURN_BYTES\)"):
        _read([frame] * 11, max_total=len(frame) * 10)
