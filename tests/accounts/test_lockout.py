"""Wrong passwords lock a username out from one address (django-axes, counts in the database): the
right password is refused too until the cool-off has passed, and the login page says so."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import httpx
from axes.models import AccessAttempt
from django.test import Client

from tests.accounts.conftest import PASSWORD

LOCKED = "Too many failed sign-in attempts"
COOL_OFF = 5  # seconds, in the cool-off test


def sign_in(client: Client, username: str, password: str, **extra):
    return client.post("/accounts/login/", {"username": username, "password": password}, **extra)


def signed_in(client: Client) -> bool:
    return 'id="signed-in-as"' in client.get("/environments/").content.decode()


def test_wrong_passwords_lock_the_account_at_the_limit_and_the_right_one_is_then_refused(alice, settings):
    client = Client()
    for attempt in range(1, settings.AXES_FAILURE_LIMIT):
        response = sign_in(client, "alice", f"wrong-{attempt}")
        assert response.status_code == 200, attempt
        assert "Please enter a correct username and password" in response.content.decode()
    locked = sign_in(client, "alice", "wrong-last")
    assert locked.status_code == 429
    page = locked.content.decode()
    assert LOCKED in page and "for 15 minutes" in page and "<code>alice</code>" in page
    right = sign_in(client, "alice", PASSWORD)
    assert right.status_code == 429 and LOCKED in right.content.decode()
    assert not signed_in(client)


def test_the_lockout_holds_one_username_from_one_address_only(alice, member, settings):
    from django.contrib.auth import get_user_model

    bob = get_user_model().objects.get(username=member.username)
    bob.set_password(PASSWORD)
    bob.save()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        sign_in(Client(), "alice", f"wrong-{attempt}")
    assert sign_in(Client(), "alice", PASSWORD).status_code == 429
    # Another person at the same address, and the same person elsewhere, are not locked out.
    assert sign_in(Client(), "bob", PASSWORD).status_code == 302
    elsewhere = Client()
    assert sign_in(elsewhere, "alice", PASSWORD, REMOTE_ADDR="192.0.2.7").status_code == 302
    assert signed_in(elsewhere)


def test_a_forged_forwarded_for_header_does_not_reset_the_count(alice, settings):
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        sign_in(Client(), "alice", f"wrong-{attempt}", HTTP_X_FORWARDED_FOR=f"198.51.100.{attempt}")
    assert sign_in(Client(), "alice", PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 429


def test_after_the_cool_off_the_right_password_signs_in(alice, settings):
    # A fast hasher so that the attempts take far less than the short cool-off on a loaded machine.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    alice.set_password(PASSWORD)
    alice.save()
    settings.AXES_COOLOFF_TIME = timedelta(seconds=COOL_OFF)
    started = time.monotonic()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        sign_in(Client(), "alice", f"wrong-{attempt}")
    assert sign_in(Client(), "alice", PASSWORD).status_code == 429
    refused_at = time.monotonic()  # an attempt during the lockout starts the wait again
    assert refused_at - started < COOL_OFF, "the machine is too slow to observe this cool-off"
    # The cool-off is the behaviour under test: wait for the clock, then the right password works.
    while time.monotonic() < refused_at + COOL_OFF + 0.5:
        time.sleep(0.1)
    client = Client()
    assert sign_in(client, "alice", PASSWORD).status_code == 302
    assert signed_in(client)


def test_a_failed_attempt_keeps_no_password(alice, settings):
    sign_in(Client(), "alice", "hunter2-the-secret-guess")
    attempt = AccessAttempt.objects.get(username="alice")
    assert attempt.ip_address == "127.0.0.1" and attempt.failures_since_start == 1
    stored = " ".join(str(getattr(attempt, f.name)) for f in AccessAttempt._meta.fields)
    assert "hunter2-the-secret-guess" not in stored


def test_sixty_fast_wrong_passwords_against_a_real_server_end_in_a_lockout(alice, server_factory, settings):
    """The finding: 60 wrong passwords in 15 s were all answered and the right one then signed in."""
    site = server_factory(server="uvicorn")
    with httpx.Client(base_url=site.url, timeout=30) as http:
        form = http.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)

        def post(password: str) -> httpx.Response:
            return http.post("/accounts/login/", data={"username": "alice", "password": password,
                                                       "csrfmiddlewaretoken": token},
                             headers={"Referer": f"{site.url}/accounts/login/"})

        statuses = [post(f"wrong-{i}").status_code for i in range(60)]
        limit = settings.AXES_FAILURE_LIMIT
        assert statuses[:limit - 1] == [200] * (limit - 1) and set(statuses[limit - 1:]) == {429}, statuses
        right = post(PASSWORD)
        assert right.status_code == 429 and LOCKED in right.text
        assert http.get("/console/").status_code == 302  # still not signed in
