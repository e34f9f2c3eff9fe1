"""Django's four password validators judge every password the platform sets; `make run`'s passes."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from orsplatform.teams.services import user_set_password


@pytest.fixture
def acme_team(live_db):
    call_command("create_team", "acme", stdout=io.StringIO())


@pytest.mark.parametrize(("password", "reason"), [
    ("a", "too short"),
    ("password123", "too common"),
    ("8675309421337", "entirely numeric"),
    ("alice-wonder", "too similar to the username"),
])
def test_add_member_refuses_a_weak_password_and_says_why(acme_team, password, reason):
    with pytest.raises(CommandError, match=reason):
        call_command("add_member", "acme", "alice-wonder", "--password", password, stdout=io.StringIO())
    response = Client().post("/accounts/login/", {"username": "alice-wonder", "password": password})
    assert response.status_code == 200  # nothing was set: the login page answers with its error


def test_the_service_refuses_a_weak_password_and_keeps_the_old_one(acme_team):
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError

    call_command("add_member", "acme", "alice", "--password", "a sound passphrase", stdout=io.StringIO())
    with pytest.raises(ValidationError):
        user_set_password(username="alice", password="a")
    assert get_user_model().objects.get(username="alice").check_password("a sound passphrase")


def test_a_sound_password_is_accepted(acme_team):
    out = io.StringIO()
    call_command("add_member", "acme", "alice", "--password", "a sound passphrase", stdout=out)
    assert "password set" in out.getvalue()
    assert Client().post("/accounts/login/", {"username": "alice", "password": "a sound passphrase"}).status_code == 302


def test_the_password_make_run_prints_passes_the_validators(live_db):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.password_validation import validate_password

    out = io.StringIO()
    call_command("dev_key", stdout=out)
    password = re.search(r"with password: (\S+)", out.getvalue()).group(1)
    validate_password(password, get_user_model().objects.get(username="dev"))
