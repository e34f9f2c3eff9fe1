from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from orsplatform.teams.auth import AuthError, extract_token, identify, key_cache, verify_token
from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import api_key_create, api_key_revoke, hash_secret, team_create, validate_slug


@pytest.fixture
def team(db):
    return team_create(slug="acme")


def test_a_new_key_has_the_documented_format_and_only_its_hash_is_stored(team):
    new = api_key_create(team=team, name="trainer")
    prefix, secret = new.token.split("_")[1:]
    assert new.token == f"ors_{prefix}_{secret}" and len(prefix) == 8 and len(secret) == 32
    key = ApiKey.objects.get(pk=new.api_key.pk)
    assert key.secret_hash == hash_secret(secret)
    stored = [str(v) for v in ApiKey.objects.filter(pk=key.pk).values().first().values()]
    assert not any(secret in v for v in stored)


def test_verification_accepts_the_key_and_rejects_a_wrong_secret(team):
    new = api_key_create(team=team, name="trainer", scopes=["sessions", "publish"])
    caller, _ = verify_token(new.token)
    assert caller.team_id == team.id and caller.can("publish") and not caller.can("manage")
    wrong = new.token[:-1] + ("0" if new.token[-1] != "0" else "1")
    with pytest.raises(AuthError):
        verify_token(wrong)


@pytest.mark.parametrize("token", ["", "ors_", "ors_abc_def", "sk-1234", "ors_ZZZZZZZZ_" + "0" * 32, "x" * 5000])
def test_malformed_keys_are_rejected(team, token):
    with pytest.raises(AuthError):
        verify_token(token)


def test_a_revoked_key_is_rejected(team):
    new = api_key_create(team=team, name="trainer")
    api_key_revoke(api_key=new.api_key)
    with pytest.raises(AuthError, match="revoked"):
        verify_token(new.token)


def test_an_expired_key_is_rejected_even_from_the_cache(team):
    new = api_key_create(team=team, name="trainer", expires_at=timezone.now() + timedelta(seconds=30))
    key_cache.clear()
    identify(new.token)
    ApiKey.objects.filter(pk=new.api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(AuthError, match="expired"):
        verify_token(new.token)
    key_cache.clear()
    with pytest.raises(AuthError):
        identify(new.token)


def test_unknown_scopes_are_refused(team):
    with pytest.raises(ValidationError):
        api_key_create(team=team, name="x", scopes=["root"])


def test_bearer_and_x_api_key_headers_are_both_read():
    assert extract_token({b"x-api-key": b"ors_a_b"}) == "ors_a_b"
    assert extract_token({b"authorization": b"Bearer ors_a_b"}) == "ors_a_b"
    assert extract_token({}) is None
    with pytest.raises(AuthError):
        extract_token({b"authorization": b"Basic dXNlcjpwYXNz"})


@pytest.mark.parametrize("slug", ["admin", "api", "static", "openenv", "console", "health", "a/b", "A", "-x", "x" * 64, "a b"])
def test_reserved_and_malformed_slugs_are_refused(db, slug):
    with pytest.raises(ValidationError):
        validate_slug(slug)
    with pytest.raises(ValidationError):
        team_create(slug=slug)


def test_two_live_keys_of_a_team_cannot_share_a_name_in_any_case(team):
    api_key_create(team=team, name="ci")
    for name in ("ci", "CI", "  ci "):
        with pytest.raises(ValidationError, match="already has a key named") as caught:
            api_key_create(team=team, name=name)
        assert caught.value.code == "name_taken"
    assert ApiKey.objects.filter(team=team).count() == 1


def test_a_revoked_keys_name_can_be_used_again_and_another_team_may_use_it(team):
    first = api_key_create(team=team, name="ci")
    api_key_revoke(api_key=first.api_key)
    again = api_key_create(team=team, name="ci")
    other = api_key_create(team=team_create(slug="globex"), name="ci")
    assert again.api_key.name == other.api_key.name == "ci"


def test_the_database_refuses_a_duplicate_live_name_that_bypasses_the_service(team):
    from django.db import IntegrityError, transaction

    api_key_create(team=team, name="ci")
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiKey.objects.create(team=team, name="Ci", prefix="dup00001", secret_hash="0" * 64)


def test_an_empty_name_is_refused(team):
    with pytest.raises(ValidationError, match="needs a name"):
        api_key_create(team=team, name="   ")
