"""Publishing failures are written for the environment's author: what failed, in one line with the
check's name, and a traceback of the package's own frames only, their paths relative to the package
root; never the platform's paths or frames. The same through the REST API, the console and the
commands (which print one line, not a Python traceback)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from orsplatform.catalog.models import Environment
from tests.catalog.support import ADDER_OPENREWARD, login, publish, tar_bytes, write_folder, zip_bytes
from tests.fixtures.server import ROOT, database_url

PLATFORM = ("/work", "site-packages", "orsplatform", "orspkg_", "/ors/", "/tmp/orsinspect")

# server.py imports the environment, whose helper module needs a package that is not installed.
MISSING_IMPORT = {
    "server.py": "from mathpkg.env import Adder\n",
    "mathpkg/__init__.py": "",
    "mathpkg/env.py": "from mathpkg import helpers\n\nhelpers.load()\n",
    "mathpkg/helpers.py": "def load():\n    import numpy_not_installed_xyz  # noqa\n",
}


def assert_for_people(body: dict) -> None:
    for text in (body["detail"], body["traceback"]):
        for path in PLATFORM:
            assert path not in text, (path, text)
    assert "\n" not in body["detail"]


def frames(traceback: str) -> list[str]:
    return re.findall(r'File "([^"]+)", line \d+', traceback)


def test_an_import_error_shows_the_tenants_frames_relative_to_the_package(owner):
    r = publish(owner, "adder", "adder.zip", zip_bytes(MISSING_IMPORT))
    assert r.status_code == 400
    body = r.json()
    assert body["check"] == "import"
    assert body["detail"] == "ModuleNotFoundError: No module named 'numpy_not_installed_xyz'"
    assert frames(body["traceback"]) == ["server.py", "mathpkg/env.py", "mathpkg/helpers.py"]
    assert body["traceback"].startswith("Traceback (most recent call last):")
    assert "import numpy_not_installed_xyz" in body["traceback"]
    assert_for_people(body)
    assert not Environment.objects.filter(slug="adder").exists()


def test_a_failure_inside_the_sdk_call_keeps_only_the_environments_frames(owner):
    broken = ADDER_OPENREWARD.replace(
        'return [TextBlock(text=f"What is {self.task_spec[\'a\']} + {self.task_spec[\'b\']}?")]',
        "return [TextBlock(text=self.task_spec['question'])]")
    assert broken != ADDER_OPENREWARD
    r = publish(owner, "adder", "adder.py", broken)
    body = r.json()
    assert r.status_code == 400 and body["check"] == "prompt"
    assert body["detail"] == "KeyError: 'question'"
    assert frames(body["traceback"]) == ["env.py"]
    assert_for_people(body)


def test_a_syntax_error_names_the_file_and_line_in_the_package(owner):
    r = publish(owner, "adder", "adder.zip", zip_bytes({"env.py": "from util import x\n", "util.py": "x = (1,\n"}))
    body = r.json()
    assert r.status_code == 400 and body["check"] == "import"
    assert body["detail"].startswith("SyntaxError: ") and "(util.py, line 1)" in body["detail"]
    assert 'File "util.py", line 1' in body["traceback"] and frames(body["traceback"])[0] == "env.py"
    assert_for_people(body)


def test_a_message_naming_a_file_of_the_package_names_it_relative_to_the_package(owner):
    source = "from pathlib import Path\n\nDATA = (Path(__file__).parent / 'data' / 'tasks.json').read_text()\n"
    r = publish(owner, "adder", "adder.py", source)
    body = r.json()
    assert r.status_code == 400 and body["check"] == "import"
    assert "No such file or directory: 'data/tasks.json'" in body["detail"]
    assert_for_people(body)


def test_a_process_that_dies_without_a_report_shows_no_platform_frames(owner):
    # The tenant prints the whole stack (the platform's inspector included) before dying.
    source = textwrap.dedent('''
        import os
        import traceback


        def die():
            traceback.print_stack()
            os._exit(3)


        die()
    ''')
    r = publish(owner, "adder", "adder.py", source)
    body = r.json()
    assert r.status_code == 400 and body["check"] == "process"
    assert "exit code 3" in body["detail"] and "'import' check" in body["detail"]
    assert frames(body["traceback"]) == ["env.py", "env.py"]
    assert_for_people(body)


def test_the_console_shows_the_failure_in_one_line_and_the_tenants_frames(owner):
    client = login(owner)
    response = client.post("/console/acme/environments/publish", {
        "package": SimpleUploadedFile("adder.tar.gz", tar_bytes(MISSING_IMPORT)), "slug": "adder"})
    assert response.status_code == 400
    page = response.content.decode()
    summary = re.search(r'<p id="failure-summary">(.*?)</p>', page, re.S).group(1)
    assert summary == ("Publishing failed: the &#x27;import&#x27; check failed: ModuleNotFoundError: "
                       "No module named &#x27;numpy_not_installed_xyz&#x27;")
    traceback = re.search(r'<pre class="traceback">(.*?)</pre>', page, re.S).group(1)
    assert frames(traceback.replace("&quot;", '"')) == ["server.py", "mathpkg/env.py", "mathpkg/helpers.py"]
    for path in PLATFORM:
        assert path not in traceback


def test_the_command_fails_with_one_line_naming_the_check(owner, tmp_path):
    folder = write_folder(tmp_path / "adder", MISSING_IMPORT)
    with pytest.raises(CommandError) as raised:
        call_command("publish_env", str(folder), "--team", "acme", stdout=io.StringIO())
    assert str(raised.value) == ("publishing adder failed: the 'import' check failed: "
                                 "ModuleNotFoundError: No module named 'numpy_not_installed_xyz'")
    # -v 2 adds the package's own frames, still without the platform's.
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("publish_env", str(folder), "--team", "acme", verbosity=2, stdout=io.StringIO(), stderr=err)
    assert frames(err.getvalue()) == ["server.py", "mathpkg/env.py", "mathpkg/helpers.py"]


def test_publish_envs_fails_with_one_line_naming_the_folder_and_the_check(live_db, tmp_path):
    write_folder(tmp_path / "envs" / "broken", {**MISSING_IMPORT, "manifest.toml": 'name = "broken"\n'})
    with pytest.raises(CommandError) as raised:
        call_command("publish_envs", "--dir", str(tmp_path / "envs"), stdout=io.StringIO())
    assert str(raised.value).startswith("publishing broken failed: the 'import' check failed: ModuleNotFoundError")
    assert "\n" not in str(raised.value)


def test_the_command_run_as_a_process_prints_one_line_and_no_python_traceback(owner, tmp_path):
    folder = write_folder(tmp_path / "adder", MISSING_IMPORT)
    done = subprocess.run([sys.executable, "manage.py", "publish_env", str(folder), "--team", "acme"], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "DATABASE_URL": database_url(),
                               "ORS_VAR_DIR": str(tmp_path / "var")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "CommandError: publishing adder failed: the 'import' check failed: "
        "ModuleNotFoundError: No module named 'numpy_not_installed_xyz'"]
    assert done.stdout == ""
