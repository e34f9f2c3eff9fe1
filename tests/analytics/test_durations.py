"""Durations read at a glance: the unit suits the size, and a fast call is never "0.0 s"."""

from __future__ import annotations

import pytest

from orsplatform.analytics.templatetags.analytics_tags import duration_text, ms, seconds


@pytest.mark.parametrize(("value", "text"), [
    (None, "–"), (float("nan"), "–"), (-0.5, "–"),
    (0, "0 ms"), (0.0004, "< 1 ms"), (0.0042, "4.2 ms"), (0.003, "3 ms"), (0.045, "45 ms"), (0.9994, "999 ms"),
    (0.9996, "1.00 s"), (1.234, "1.23 s"), (9.99, "9.99 s"), (12.34, "12.3 s"), (59.96, "1 min 0 s"),
    (61, "1 min 1 s"), (754.4, "12 min 34 s"), (3599.6, "1 h 0 min"), (3600, "1 h 0 min"), (5400, "1 h 30 min"),
    (90000, "25 h 0 min"),
])
def test_a_duration_in_seconds_reads_in_the_unit_that_suits_it(value, text):
    assert duration_text(value) == text
    assert seconds(value) == text


def test_nothing_under_a_second_is_shown_as_zero_seconds():
    for value in (0.0001, 0.001, 0.01, 0.05, 0.1, 0.049, 0.5):
        assert not duration_text(value).startswith("0"), value
        assert duration_text(value).endswith("ms"), value


@pytest.mark.parametrize(("value", "text"), [(None, "–"), (0.4, "0.4 ms"), (12, "12 ms"), (250.4, "250 ms"),
                                             (1500, "1.50 s"), (75_000, "1 min 15 s")])
def test_latencies_in_milliseconds_switch_to_seconds_above_one_second(value, text):
    assert ms(value) == text
