"""A private environment of acme with two versions (its README is hostile), a public one, and a few
scored sessions of acme on the private one, for the environment-page tests.

The three packages go through the sandbox once per module (and worker): the module's first `hub`
publishes them, the others get the same rows and stored files back (`Published`), with the same
owner, member and outsider made afresh by the tenancy fixtures. A test that publishes or rolls back
does it on its own copy: every test starts from what publishing left."""

from __future__ import annotations

import copy
import shutil
import textwrap
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core import serializers
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.utils import timezone

from orsplatform.catalog.models import Environment, EnvironmentVersion, Split, Task
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


@dataclass
class Published:
    """What the first `hub` of a module published: the stored packages as publishing left them and
    the rows it wrote (serialized), so the module's other tests get the same environments without
    three more sandboxed inspections each."""

    packages: Path | None = None  # a pristine copy, outside any test's tmp_path
    stored_at: str = ""  # where publishing stored them (the prefix of every package_path)
    rows: list[dict] | None = None


@pytest.fixture(scope="module")
def published_hub(tmp_path_factory) -> Published:
    return Published(packages=tmp_path_factory.mktemp("hub-packages") / "packages")


def _publish(owner, tmp_path: Path) -> None:
    user = get_user_model().objects.get(username=owner.username)
    pkg = write_package(tmp_path / "quiz", version="one", readme=HOSTILE_README, name="quiz", visibility="private")
    environment_publish(team=owner.team, source_dir=pkg, created_by=user)
    write_package(pkg, version="two", readme=HOSTILE_README + "\nNow with version two.\n", name="quiz",
                  visibility="private")
    environment_publish(team=owner.team, source_dir=pkg, created_by=user)
    pub = write_package(tmp_path / "echo", version="one", readme="# Echo\n\nA public echo.\n", name="echo",
                        visibility="public")
    environment_publish(team=owner.team, source_dir=pub, created_by=user)


def _keep(published: Published, team, packages: Path) -> None:
    environments = Environment.objects.filter(team=team)
    rows = [*environments, *EnvironmentVersion.objects.filter(environment__in=environments),
            *Split.objects.filter(environment__in=environments),
            *Task.objects.filter(split__environment__in=environments)]
    shutil.copytree(packages, published.packages, symlinks=True)
    published.stored_at, published.rows = str(packages), serializers.serialize("python", rows)


def _restore(published: Published, owner, packages: Path) -> None:
    """The kept rows again, under this test's acme and alice (new ids every test), and a copy of the
    stored packages of its own (tests write into them)."""
    shutil.copytree(published.packages, packages, symlinks=True)
    user = get_user_model().objects.get(username=owner.username)
    rows = copy.deepcopy(published.rows)
    for row in rows:
        fields = row["fields"]
        if row["model"] == "catalog.environment":
            fields["team"] = owner.team.pk
        elif row["model"] == "catalog.environmentversion":
            assert fields["created_by_key"] is None
            fields["created_by"] = user.pk
            fields["package_path"] = str(packages) + fields["package_path"].removeprefix(published.stored_at)
    with transaction.atomic():  # an environment names its current version before the version is back
        for item in serializers.deserialize("python", rows):
            item.save()


@pytest.fixture
def hub(owner, member, outsider, settings, tmp_path, published_hub) -> Hub:
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"
    cache.clear()  # READMEs, file lists and prompts are cached by content hash, which repeats across tests
    if published_hub.rows is None:
        _publish(owner, tmp_path)
        _keep(published_hub, owner.team, settings.ORS_PACKAGE_DIR)
    else:
        _restore(published_hub, owner, settings.ORS_PACKAGE_DIR)
    private = Environment.objects.get(team=owner.team, slug="quiz")
    public = Environment.objects.get(team=owner.team, slug="echo")
    v2 = private.current_version
    assert v2.number == 2
    now = timezone.now()
    for i, (index, reward) in enumerate([(0, 1.0), (0, 0.0), (1, 0.0), (1, 0.0), (2, 1.0)]):
        Session.objects.create(
            sid=f"quiz-{i}", team=owner.team, environment=private, version=v2, task_spec={"word": f"trainword{index}"},
            split="train", task_index=index, status=Session.Status.DELETED, finished=True, total_reward=reward,
            created_at=now - timedelta(minutes=30 - i), last_activity_at=now, ended_at=now, calls=1,
            prompt=[{"type": "text", "text": f"Say trainword{index} (two)"}])
    return Hub(private=private, public=public)
