"""What each API-key scope grants is said where keys are made: the console's key form names every
scope with what it grants, and the manage scope is one a key can be given."""

from __future__ import annotations

from orsplatform.teams.auth import Access, AccessDenied, admit, identify
from orsplatform.teams.services import api_key_create
from tests.hub.conftest import login


def test_the_key_form_says_what_each_scope_grants(owner):
    page = login(owner).get("/console/acme/").content.decode()
    for label in ("sessions: run episodes and evaluations", "publish: publish environments and tasks",
                  "manage: register and remove the team&#x27;s AAP agents"):
        assert label in page


def test_only_a_key_with_the_manage_scope_is_admitted_to_manage(owner, acme):
    managing = identify(api_key_create(team=acme, name="m", scopes=["manage"]).token)
    assert admit(managing, Access.MANAGE) is managing
    sessions_only = identify(api_key_create(team=acme, name="s", scopes=["sessions", "publish"]).token)
    try:
        admit(sessions_only, Access.MANAGE)
    except AccessDenied as exc:
        assert "'manage' scope" in str(exc)
    else:
        raise AssertionError("a key without the manage scope was admitted to manage")
