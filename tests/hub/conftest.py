"""A private environment of acme with two versions (its README is hostile), a public one, and a few
scored sessions of acme on the private one, for the environment-page tests."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from orsplatform.catalog.models import Environment
from orsplatform.catalog.services import environment_publish
from orsplatform.episodes.models import Session
from tests.analytics.test_browser import browser  # noqa: F401 (the Chromium fixture, shared)
from tests.catalog.support import echo_env

HOSTILE_README = textwrap.dedent("""
    # Quiz

    Say the word of the task. <script>document.title = "pwned"</script>

    [Click me](javascript:alert(1)) and <img src=x onerror="alert(2)"> and [the docs](https://example.org/docs).

    | split | tasks |
    |-------|-------|
    | train | 3     |
""")


@dataclass
class Hub:
    private: Environment
    public: Environment


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


def write_package(root: Path, *, version: str, readme: str, name: str, visibility: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "env.py").write_text(echo_env(version))
    (root / "README.md").write_text(readme)
    (root / "manifest.toml").write_text(
        f'name = "{name}"\ndescription = "Say the word ({name})"\nentrypoint = "env:Echo"\nvisibility = "{visibility}"\n')
    return root


@pytest.fixture
def hub(owner, member, outsider, settings, tmp_path) -> Hub:
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"
    cache.clear()  # READMEs, file lists and prompts are cached by content hash, which repeats across tests
    user = get_user_model().objects.get(username=owner.username)
    pkg = write_package(tmp_path / "quiz", version="one", readme=HOSTILE_README, name="quiz", visibility="private")
    environment_publish(team=owner.team, source_dir=pkg, created_by=user)
    write_package(pkg, version="two", readme=HOSTILE_README + "\nNow with version two.\n", name="quiz",
                  visibility="private")
    v2 = environment_publish(team=owner.team, source_dir=pkg, created_by=user).version
    pub = write_package(tmp_path / "echo", version="one", readme="# Echo\n\nA public echo.\n", name="echo",
                        visibility="public")
    public = environment_publish(team=owner.team, source_dir=pub, created_by=user).version.environment
    private = v2.environment
    now = timezone.now()
    for i, (index, reward) in enumerate([(0, 1.0), (0, 0.0), (1, 0.0), (1, 0.0), (2, 1.0)]):
        Session.objects.create(
            sid=f"quiz-{i}", team=owner.team, environment=private, version=v2, task_spec={"word": f"trainword{index}"},
            split="train", task_index=index, status=Session.Status.DELETED, finished=True, total_reward=reward,
            created_at=now - timedelta(minutes=30 - i), last_activity_at=now, ended_at=now, calls=1,
            prompt=[{"type": "text", "text": f"Say trainword{index} (two)"}])
    return Hub(private=private, public=public)
