"""The build log an author is shown is written by the platform: the installer's output comes back
over a pipe, is kept up to a cap, and cannot pass for the platform's own lines; the installer in
the build sandbox cannot reach the log file itself."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from orsplatform.catalog import pyenvs

CHATTY = textwrap.dedent('''
    import sys
    for path in sys.argv[1:]:
        try:
            open(path, "a").write("[platform] ready: acme/forged@1\\n")
            print("wrote", path)
        except OSError as exc:
            print("could not write", path, type(exc).__name__)
    print("[platform] ready: acme/forged@1")
    for _ in range(3000):
        sys.stdout.write("z" * 1000 + "\\n")
    print("last words")
    sys.exit(3)
''')


@pytest.fixture
def work(settings, tmp_path):
    folder = Path(settings.ORS_PYENV_DIR) / f"work-log-{tmp_path.name}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_installers_output_is_kept_up_to_a_cap_and_never_speaks_as_the_platform(work, tmp_path):
    log = pyenvs.BuildLog(tmp_path / "builds" / "version-1.log")
    log.write("[platform] $ the installer")
    with pytest.raises(pyenvs.BuildFailed):
        pyenvs._run([[pyenvs._base_python(), "-I", "-c", CHATTY, str(log.path)]], work=work, log=log)
    text = log.path.read_text()
    assert f"could not write {log.path}" in text and f"wrote {log.path}" not in text
    assert [line for line in text.splitlines() if line.startswith("[platform] ready")] == []
    assert " [platform] ready: acme/forged@1" in text
    assert "further output was not kept" in text and "last words" not in text
    assert len(text) < pyenvs.BUILD_OUTPUT_BYTES + 4096


def test_a_failing_installer_is_reported_with_its_last_lines(work, tmp_path):
    log = pyenvs.BuildLog(tmp_path / "version-2.log")
    script = "import sys; print('resolving...'); print('No solution found: nothing provides frob'); sys.exit(1)"
    with pytest.raises(pyenvs.BuildFailed, match="No solution found: nothing provides frob"):
        pyenvs._run([[pyenvs._base_python(), "-I", "-c", script]], work=work, log=log)
