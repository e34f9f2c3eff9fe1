"""``manage.py publish_env`` (a folder, zip, tar.gz or .py) and ``publish_envs`` through the same service."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from orsplatform.catalog.models import Environment, Task
from tests.catalog.support import (
    ECHO_ENV,
    FILE_TASKS_ENV,
    MANIFEST,
    jsonl,
    tar_bytes,
    write_folder,
    zip_bytes,
)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("publish_env", *args, stdout=out)
    return out.getvalue().strip()


def test_a_folder_with_a_manifest_publishes_under_the_manifest_name(owner, tmp_path):
    folder = write_folder(tmp_path / "src", {"env.py": FILE_TASKS_ENV, "manifest.toml": MANIFEST.format(
        name="quizzer", cls="Quiz") + 'visibility = "public"\n', "README.md": "# Quiz\n",
        "tasks/train.jsonl": jsonl([{"question": "a", "answer": "1"}])})
    assert run(str(folder), "--team", "acme") == "published acme/quizzer@1"
    env = Environment.objects.get(slug="quizzer")
    assert env.visibility == "public" and env.description == "A test environment."
    assert Task.objects.filter(split__environment=env).count() == 1
    assert run(str(folder), "--team", "acme") == "unchanged acme/quizzer@1"


@pytest.mark.parametrize("name,content", [
    ("echo.zip", zip_bytes({"env.py": ECHO_ENV})),
    ("echo.tar.gz", tar_bytes({"echo/env.py": ECHO_ENV})),
    ("echo.py", ECHO_ENV.encode()),
])
def test_each_archive_kind_publishes_with_the_slug_from_the_file_name(owner, tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    assert run(str(path), "--team", "acme") == "published acme/echo@1"


def test_slug_and_visibility_can_be_given(owner, tmp_path):
    path = tmp_path / "x.py"
    path.write_text(ECHO_ENV)
    assert run(str(path), "--team", "acme", "--slug", "named", "--visibility", "public") == "published acme/named@1"
    assert Environment.objects.get(slug="named").visibility == "public"


def test_a_failing_package_exits_non_zero_with_the_report(owner, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(ECHO_ENV.replace("class Echo", "import nonexistent_module_xyz\nclass Echo"))
    with pytest.raises(CommandError) as raised:
        run(str(path), "--team", "acme")
    message = str(raised.value)
    assert message == ("publishing bad.py failed: the 'import' check failed: "
                       "ModuleNotFoundError: No module named 'nonexistent_module_xyz'")
    assert not Environment.objects.filter(slug="bad").exists()


def test_unknown_team_and_missing_path_are_errors(owner, tmp_path):
    with pytest.raises(CommandError, match="No team"):
        run(str(tmp_path), "--team", "nope")
    with pytest.raises(CommandError, match="No such file"):
        run(str(tmp_path / "missing.zip"), "--team", "acme")


def test_a_symlink_in_a_folder_is_refused(owner, tmp_path):
    folder = write_folder(tmp_path / "src", {"env.py": ECHO_ENV})
    (folder / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(CommandError, match="symbolic link"):
        run(str(folder), "--team", "acme", "--slug", "linky")


def test_the_bundled_environments_are_published_through_the_same_path(live_db):
    out = io.StringIO()
    call_command("publish_envs", stdout=out)
    assert out.getvalue().split("\n")[:4] == ["unchanged builtin/code@1", "unchanged builtin/math@1",
                                              "unchanged builtin/vision@1", "unchanged builtin/wordle@1"]
    code = Environment.objects.get(team__slug="builtin", slug="code")
    assert Task.objects.filter(split__environment=code, split__name="train").count() == 24
