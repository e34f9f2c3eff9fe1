"""Malformed dates, inverted ranges, unknown ids, huge page numbers and injection attempts: a clear
message on the page (400) or a 400 {"detail": ...} from the API, never a 500."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.test import Client

from orsplatform.episodes.models import Session
from tests.analytics.conftest import login

BAD_FILTERS = [
    ({"start": "2024-13-45"}, "is not a valid date"),
    ({"end": "yesterday"}, "is not a valid date"),
    ({"start": "0001-01-01"}, "year between"),
    ({"end": "9999-12-31"}, "year between"),
    ({"start": "2024-05-02", "end": "2024-05-01"}, "must be before the end"),
    ({"start": "2024-05-01T10:00", "end": "2024-05-01T09:00"}, "must be before the end"),
    ({"range": "42y"}, "Unknown time range"),
    ({"start": "x" * 500}, "too long"),
    ({"start": "2024-01-01\x00"}, "NUL character"),
]
BAD_SESSION_FILTERS = [
    *BAD_FILTERS,
    ({"environment": "acme/nope"}, "Unknown environment"),
    ({"environment": "no-slash"}, "Unknown environment"),
    ({"environment": "acme/puzzle", "version": "99"}, "has no version 99"),
    ({"environment": "acme/puzzle", "version": "1.5"}, "is not a version number"),
    ({"version": "1"}, "Choose an environment"),
    ({"api_key": "deadbeef"}, "Unknown API key"),
    ({"status": "exploded"}, "Unknown status"),
    ({"reward_min": "lots"}, "is not a number"),
    ({"reward_max": "nan"}, "finite number"),
    ({"reward_min": "inf"}, "finite number"),
    ({"reward_min": "1", "reward_max": "0"}, "is above the maximum reward"),
    ({"page": "0"}, "between 1 and 10,000"),
    ({"page": "99999999999999999999"}, "is not a page number"),
    ({"page": "10001"}, "between 1 and 10,000"),
    ({"page": "50"}, "past the last page"),
    ({"page": "-1"}, "is not a page number"),
    ({"page": "²"}, "is not a page number"),
    ({"environment": "acme/puzzle' OR '1'='1"}, "Unknown environment"),
    ({"status": "deleted'; DROP TABLE episodes_session; --"}, "Unknown status"),
]


@pytest.mark.parametrize(("params", "message"), BAD_SESSION_FILTERS)
def test_bad_explorer_filters_show_a_message_on_the_page(seeded, owner, params, message):
    response = login(owner).get("/analytics/acme/sessions/?" + urlencode(params))
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="filter-errors"' in page and message in page
    assert 'id="session-filters"' in page  # the form is there to fix them


@pytest.mark.parametrize(("params", "message"), BAD_FILTERS)
def test_bad_time_ranges_show_a_message_on_the_overview_and_environment_pages(seeded, owner, params, message):
    client = login(owner)
    for url in ("/analytics/acme/", "/analytics/acme/environments/acme/puzzle/"):
        response = client.get(url + "?" + urlencode(params))
        assert response.status_code == 400 and message in response.content.decode(), url


def test_an_unknown_version_on_the_environment_page_is_a_message(seeded, owner):
    response = login(owner).get("/analytics/acme/environments/acme/puzzle/?version=7")
    assert response.status_code == 400 and "has no version 7" in response.content.decode()


@pytest.mark.parametrize(("params", "message"), BAD_SESSION_FILTERS)
def test_bad_filters_are_a_400_with_detail_from_the_api(seeded, owner, params, message):
    response = Client().get("/api/v1/analytics/sessions?" + urlencode(params), HTTP_X_API_KEY=owner.token)
    assert response.status_code == 400 and message in response.json()["detail"]
    if "page" not in params:
        export = Client().get("/api/v1/analytics/export.jsonl?" + urlencode(params), HTTP_X_API_KEY=owner.token)
        assert export.status_code == 400 and message in export.json()["detail"]


@pytest.mark.parametrize(("params", "message"), BAD_FILTERS)
def test_bad_time_ranges_are_a_400_from_the_numbers_api(seeded, owner, params, message):
    for url in ("/api/v1/analytics/overview", "/api/v1/analytics/environments/acme/puzzle"):
        response = Client().get(url + "?" + urlencode(params), HTTP_X_API_KEY=owner.token)
        assert response.status_code == 400 and message in response.json()["detail"], url


def test_bad_export_filters_from_the_explorer_are_a_400_with_the_reason(seeded, owner):
    response = login(owner).get("/analytics/acme/export.parquet?start=never")
    assert response.status_code == 400 and "is not a valid date" in response.content.decode()


def test_injection_attempts_are_escaped_and_change_nothing(seeded, owner):
    before = Session.objects.count()
    script = '<script>alert("x")</script>'
    client = login(owner)
    response = client.get("/analytics/acme/sessions/?" + urlencode({"environment": script, "reward_min": script}))
    page = response.content.decode()
    assert response.status_code == 400 and script not in page and "&lt;script&gt;" in page
    response = client.get("/analytics/acme/?" + urlencode({"start": script}))
    assert response.status_code == 400 and script not in response.content.decode()
    assert Session.objects.count() == before
    # Unknown ids in paths are plain 404s.
    assert client.get("/analytics/acme/sessions/%27%20OR%201=1--/").status_code == 404
    assert client.get("/analytics/acme/environments/acme/x%27or/").status_code == 404


def test_tenant_chosen_names_are_escaped_in_charts_and_tables(seeded, owner):
    from orsplatform.episodes.models import ToolCall

    call = ToolCall.objects.filter(session__sid="acme-puzzle-1").first()
    ToolCall.objects.filter(pk=call.pk).update(name='<img src=x onerror=alert(1)>')
    from orsplatform.analytics.services import tool_call_rollup_rebuild, tool_call_rollup_run

    tool_call_rollup_rebuild()
    tool_call_rollup_run(settle=0)
    client = login(owner)
    for url in ("/analytics/acme/environments/acme/puzzle/", "/analytics/acme/sessions/acme-puzzle-1/"):
        page = client.get(url).content.decode()
        assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page, url


def test_a_custom_range_keeps_the_other_filters(seeded, owner):
    ok = login(owner).get("/analytics/acme/sessions/?status=deleted&start=2020-01-01&end=2099-12-31")
    text = ok.content.decode()
    assert ok.status_code == 200 and text.count('class="session-link"') == 12
    assert 'name="status" value="deleted"' in text  # the time-range form keeps the status filter


def test_a_window_of_a_thousand_years_draws_only_the_time_that_has_data(seeded, owner):
    from orsplatform.analytics import selectors
    from orsplatform.analytics.filters import parse_window

    data = selectors.overview(team=owner.team, window=parse_window({"start": "1970-01-01", "end": "2999-12-31"}))
    assert len(data["per_period"]) <= 48 and data["totals"]["sessions"] == 13
    response = login(owner).get("/analytics/acme/environments/acme/puzzle/?start=1970-01-01&end=2999-12-31")
    assert response.status_code == 200 and len(response.content) < 200_000
