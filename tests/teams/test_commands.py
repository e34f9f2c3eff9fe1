import io

import pytest
from django.core.management import CommandError, call_command

from orsplatform.teams.auth import verify_token
from orsplatform.teams.models import ApiKey, Membership, Team


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_operators_can_create_a_team_add_a_member_and_mint_and_revoke_a_key(db):
    run("create_team", "acme", "--name", "Acme Labs")
    assert Team.objects.get(slug="acme").name == "Acme Labs"
    run("add_member", "acme", "alice", "--role", "owner")
    assert Membership.objects.get(team__slug="acme", user__username="alice").role == "owner"
    output = run("create_api_key", "acme", "trainer", "--scopes", "sessions,publish")
    token = output.strip().splitlines()[-1]
    caller, _ = verify_token(token)
    assert caller.scopes == {"sessions", "publish"}
    run("revoke_api_key", token.split("_")[1])
    assert ApiKey.objects.get(prefix=token.split("_")[1]).revoked_at is not None


def test_a_key_can_be_bound_to_an_environment(db):
    from orsplatform.catalog.models import Environment

    run("create_team", "acme")
    env = Environment.objects.create(team=Team.objects.get(slug="acme"), slug="maze")
    token = run("create_api_key", "acme", "bound", "--environment", "acme/maze").strip().splitlines()[-1]
    caller, _ = verify_token(token)
    assert caller.environment_id == env.id


@pytest.mark.parametrize("args", [
    ("create_team", "admin"),
    ("create_team", "bad/slug"),
    ("add_member", "nope", "alice"),
    ("create_api_key", "nope", "k"),
    ("revoke_api_key", "deadbeef"),
])
def test_bad_operator_input_is_a_clear_error_and_creates_nothing(db, args):
    teams, keys = Team.objects.count(), ApiKey.objects.count()
    with pytest.raises(CommandError):
        run(*args)
    assert (Team.objects.count(), ApiKey.objects.count()) == (teams, keys)


def test_create_api_key_refuses_unknown_scopes(db):
    run("create_team", "acme")
    with pytest.raises(CommandError):
        run("create_api_key", "acme", "k", "--scopes", "sessions,root")
    assert not ApiKey.objects.exists()


def test_create_api_key_refuses_a_name_a_live_key_of_the_team_has(db):
    run("create_team", "acme")
    run("create_api_key", "acme", "bench")
    with pytest.raises(CommandError, match="already has a key named 'bench'"):
        run("create_api_key", "acme", "bench")
    assert ApiKey.objects.filter(team__slug="acme").count() == 1
