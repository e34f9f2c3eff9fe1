"""What `make run` prints lets a newcomer sign in as the built-in team's owner: a one-time link and a
fresh password (embedded default only). `add_member` can set a password."""

from __future__ import annotations

import io
import re
from unittest import mock

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client


def signs_in(username: str, password: str) -> bool:
    """Through the login page, as a person does (the lockout backend needs the request)."""
    response = Client().post("/accounts/login/", {"username": username, "password": password})
    return response.status_code == 302 and response["Location"] == "/console/"


def dev_key(**kwargs) -> str:
    out = io.StringIO()
    call_command("dev_key", stdout=out, **kwargs)
    return out.getvalue()


def test_dev_key_prints_the_console_a_one_time_link_a_password_and_the_key_last(live_db):
    output = dev_key(base_url="http://127.0.0.1:9000")
    assert "Console: http://127.0.0.1:9000/console/" in output
    assert re.search(r"one-time link: http://127\.0\.0\.1:9000/accounts/dev-login/\S+/\S+/", output)
    assert re.search(r"with password: \S{12,}", output)
    assert re.fullmatch(r"ors_[0-9a-f]{8}_[0-9a-f]{32}", output.strip().splitlines()[-1])


def test_the_printed_link_signs_in_once_and_lands_on_the_console(live_db):
    link = re.search(r"one-time link: http://[^/]+(\S+)", dev_key()).group(1)
    client = Client()
    response = client.get(link)
    assert response.status_code == 302 and response["Location"] == "/console/"
    team_page = client.get("/console/", follow=True)
    assert team_page.status_code == 200 and "builtin" in team_page.content.decode()
    again = Client().get(link)
    assert again.status_code == 400 and "no longer works" in again.content.decode()


def test_the_printed_password_signs_in_and_the_next_run_replaces_it(live_db):
    first = re.search(r"with password: (\S+)", dev_key()).group(1)
    assert signs_in("dev", first)
    second = re.search(r"with password: (\S+)", dev_key()).group(1)
    assert second != first
    assert not signs_in("dev", first)
    assert signs_in("dev", second)


def test_no_sign_in_is_printed_or_served_with_production_settings(live_db, settings):
    settings.ORS_DEV_LOGIN = False
    output = dev_key()
    assert "dev-login" not in output and "password" not in output
    assert not get_user_model().objects.filter(username="dev").exists()
    assert Client().get("/accounts/dev-login/MQ/abc-def/").status_code == 404


def test_dev_login_defaults_off_when_a_secret_key_is_configured():
    import importlib
    import os

    import orsplatform.settings as module

    with mock.patch.dict(os.environ, {"SECRET_KEY": "a-real-one", "ALLOWED_HOSTS": "ors.example.com"}):
        assert importlib.reload(module).ORS_DEV_LOGIN is False
    importlib.reload(module)


def test_add_member_sets_or_prompts_for_a_password(live_db):
    call_command("create_team", "acme", stdout=io.StringIO())
    call_command("add_member", "acme", "alice", "--role", "owner", "--password", "s3cret-pass", stdout=io.StringIO())
    assert signs_in("alice", "s3cret-pass")
    with mock.patch("getpass.getpass", side_effect=["typed-pass", "typed-pass"]):
        call_command("add_member", "acme", "bob", "--prompt-password", stdout=io.StringIO())
    assert signs_in("bob", "typed-pass")
