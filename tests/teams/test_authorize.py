"""The one access policy (teams.auth.authorize): what each kind of request needs, with a key of
each scope and without a key, under both anonymous settings. The ORS app, the REST API and the
coming faces all decide through it."""

from __future__ import annotations

import pytest

from orsplatform.teams.auth import ANONYMOUS, Access, AccessDenied, AuthError, authorize


@pytest.fixture
def publish_only(acme):
    from orsplatform.teams.services import api_key_create

    return api_key_create(team=acme, name="ci", scopes=["publish"]).token


def outcome(token, access) -> str:
    try:
        caller = authorize(token, access)
    except AccessDenied:
        return "403"
    except AuthError:
        return "401"
    return "anonymous" if caller is ANONYMOUS else "team"


@pytest.mark.django_db
def test_each_access_admits_exactly_the_keys_and_anonymous_callers_it_should(settings, member, publish_only):
    settings.ORS_ANONYMOUS_CATALOG, settings.ORS_ANONYMOUS_SESSIONS = True, False
    table = {access: (outcome(None, access), outcome(member.token, access), outcome(publish_only, access))
             for access in Access}
    assert table == {
        Access.OPEN: ("anonymous", "anonymous", "anonymous"),
        Access.KEY: ("401", "team", "team"),
        Access.CATALOG: ("anonymous", "team", "team"),
        Access.SESSIONS: ("401", "team", "403"),
        Access.TEAM: ("401", "team", "403"),
        Access.PUBLISH: ("401", "403", "team"),
        Access.MANAGE: ("401", "403", "403"),
    }


@pytest.mark.django_db
def test_the_anonymous_settings_open_only_the_catalog_and_sessions(settings):
    settings.ORS_ANONYMOUS_CATALOG, settings.ORS_ANONYMOUS_SESSIONS = False, True
    assert [outcome(None, a) for a in Access] == ["anonymous", "401", "401", "anonymous", "401", "401", "401"]


@pytest.mark.django_db
def test_a_bad_key_is_refused_whatever_the_access_except_open(member):
    assert [outcome("ors_00000000_" + "0" * 32, a) for a in Access] == ["anonymous", *["401"] * 6]
