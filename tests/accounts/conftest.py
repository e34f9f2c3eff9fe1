"""Fixtures of the accounts tests: a person with a password, and sign-in counts that do not outlive a test."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib.auth import get_user_model

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _fresh_sign_in_counts(live_db):
    # Failed attempts live in the database; the next test (or a browser test signing in as the same
    # user from 127.0.0.1) must not start locked out.
    yield
    for model in (AccessAttempt, AccessFailureLog, AccessLog):
        model.objects.all().delete()


@pytest.fixture
def alice(owner):
    user = get_user_model().objects.get(username=owner.username)
    user.set_password(PASSWORD)
    user.save()
    return user
