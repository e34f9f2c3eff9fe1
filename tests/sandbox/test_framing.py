"""The sandbox channel's limits (orsplatform/sandbox/framing.py) on their own: read from the
environment where there is no Django (a runner node), from the installed settings lookup where there
is, and kept consistent whatever an operator sets. The fast tier."""

from __future__ import annotations

import pytest

from orsplatform.sandbox import framing


@pytest.fixture
def no_lookup(monkeypatch):
    monkeypatch.setattr(framing, "settings_lookup", None)
    for name in framing.DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_without_settings_the_documented_defaults_apply(no_lookup):
    limits = framing.ChannelLimits.current()
    assert limits == framing.ChannelLimits(max_output=4 * framing.MiB, max_frame=64 * framing.MiB,
                                           deadline=10.0, truncated=64 * 1024)


def test_the_environment_sets_them_and_an_empty_value_means_the_default(no_lookup):
    no_lookup.setenv("ORS_MAX_TOOL_OUTPUT_BYTES", "2048")
    no_lookup.setenv("ORS_FRAME_DEADLINE_SECONDS", "2.5")
    no_lookup.setenv("ORS_AUDIT_TRUNCATED_BYTES", "")
    limits = framing.ChannelLimits.current()
    assert (limits.max_output, limits.deadline, limits.truncated) == (2048, 2.5, 2048)


def test_the_limits_stay_consistent_whatever_is_set(no_lookup):
    # An answer limit below 1 KiB is raised to it; a frame may always hold a whole answer; the audit
    # log never keeps more than an answer may be, nor a negative amount.
    no_lookup.setenv("ORS_MAX_TOOL_OUTPUT_BYTES", "10")
    no_lookup.setenv("ORS_MAX_FRAME_BYTES", "5")
    no_lookup.setenv("ORS_AUDIT_TRUNCATED_BYTES", "-3")
    limits = framing.ChannelLimits.current()
    assert (limits.max_output, limits.max_frame, limits.truncated) == (1024, 1024, 0)


def test_an_installed_settings_lookup_wins_over_the_environment(no_lookup):
    no_lookup.setenv("ORS_MAX_TOOL_OUTPUT_BYTES", "2048")
    seen = {}

    def lookup(name, value):
        seen[name] = value
        return 8192 if name == "ORS_MAX_TOOL_OUTPUT_BYTES" else value

    no_lookup.setattr(framing, "settings_lookup", lookup)
    assert framing.ChannelLimits.current().max_output == 8192
    assert seen["ORS_MAX_TOOL_OUTPUT_BYTES"] == 2048  # the environment's value is the lookup's default
    assert set(seen) == set(framing.DEFAULTS)


@pytest.mark.parametrize(("frame", "reply_id"), [
    (b'{"id": 42, "result": "x"}', b"42"), (b'  {"id":7}', b"7"), (b'{ "id" : 123456789012345678 ,', b"123456789012345678"),
])
def test_a_replys_id_is_read_from_the_start_of_a_frame(frame, reply_id):
    assert framing.REPLY_ID.match(frame).group(1) == reply_id


@pytest.mark.parametrize("frame", [b'{"result": 1, "id": 4}', b'{"id": "4"}', b'{"id": 1234567890123456789}', b"[1]"])
def test_a_frame_not_starting_with_its_numeric_id_has_none(frame):
    assert framing.REPLY_ID.match(frame) is None


def test_an_answer_over_the_limit_says_its_size_and_the_setting_and_keeps_only_its_head():
    error = framing.ReplyTooLarge(5_000_000, 4_194_304, head='{"id": 1, "result": "aaaa')
    assert str(error) == ("The environment's answer is 5,000,000 bytes, over the 4,194,304-byte limit "
                          "(ORS_MAX_TOOL_OUTPUT_BYTES).")
    assert (error.size, error.limit, error.head) == (5_000_000, 4_194_304, '{"id": 1, "result": "aaaa')
