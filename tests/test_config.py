"""The typed settings registry (orsplatform/config.py): a bad value stops the web app, manage.py and a
runner node before they start, naming the variable, the value and what is allowed; the documented table
is the registry's; every registered variable is read and every variable read is registered."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from orsplatform import config
from tests.fixtures.server import ROOT, free_port

BAD = {"ORS_SANDBOX": "bwarp", "DEBUG": "ture", "ORS_MAX_BODY_BYTES": "-5"}
# Variables code reads that are not settings of the platform: the shell's, make's, or a runner
# password named after its host (executors/acl.py), or those the compose file passes to healthchecks.
NOT_SETTINGS = {"PATH", "HOST", "PORT", "DJANGO_SETTINGS_MODULE", "RUNNER_HOSTNAME"}


def environ(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in config.REGISTRY or k in ("DATABASE_URL", "REDIS_URL")}
    return {**base, "DJANGO_SETTINGS_MODULE": "orsplatform.settings", **env}


def refused(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def assert_names_every_bad_value(output: str) -> None:
    assert "ORS_SANDBOX='bwarp' is not allowed: expected one of auto, gvisor, bwrap, none" in output
    assert "DEBUG='ture' is not allowed: expected a boolean" in output
    assert "ORS_MAX_BODY_BYTES='-5' is not allowed: expected an integer >= 0" in output


def test_manage_py_check_refuses_bad_values_naming_each_one():
    assert_names_every_bad_value(refused([sys.executable, "manage.py", "check"], environ(**BAD)))


def test_the_asgi_server_refuses_bad_values_before_it_serves():
    cmd = [sys.executable, "-m", "uvicorn", "orsplatform.asgi:application", "--host", "127.0.0.1",
           "--port", str(free_port()), "--log-level", "warning"]
    assert_names_every_bad_value(refused(cmd, environ(**BAD)))


def test_a_runner_node_refuses_bad_values_without_django_or_a_database():
    env = {k: v for k, v in environ(**BAD).items()
           if k not in ("DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    cmd = [sys.executable, "-m", "celery", "-A", "orsplatform.executors.node", "worker", "--pool", "threads",
           "--hostname", "config-test@%h", "--without-mingle", "--without-gossip"]
    output = refused(cmd, env)
    assert "runner node: Refusing to start" in output
    assert_names_every_bad_value(output)


def test_a_secret_with_a_bad_value_is_never_echoed():
    setting = config.Setting(name="X_SECRET", kind="int", default=1, help="", group="", secret=True)
    assert config.shown_value(setting, "hunter2") == "<hidden>"


@pytest.mark.parametrize("raw,expected", [("1", True), ("TRUE", True), (" yes ", True), ("on", True),
                                          ("0", False), ("false", False), ("No", False), ("off", False)])
def test_booleans_accept_the_usual_spellings(raw, expected):
    assert config.load({"DEBUG": raw})["DEBUG"] is expected


def test_an_empty_value_means_the_default():
    assert config.load({"ORS_SANDBOX": "", "ORS_TOOL_THREADS": " "})["ORS_SANDBOX"] == "auto"


def test_derived_defaults_follow_what_they_derive_from(tmp_path):
    got = config.load({"ORS_VAR_DIR": str(tmp_path), "REDIS_URL": "redis://h:6379/1", "ORS_BUILTIN_TEAM": "ops"})
    assert got["ORS_PACKAGE_DIR"] == tmp_path / "packages"
    assert got["ORS_UV_CACHE_DIR"] == tmp_path / "pyenvs" / ".uv-cache"
    assert got["DATABASE_URL"] == f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert got["CELERY_BROKER_URL"] == "redis://h:6379/1"
    assert config.load({})["CELERY_BROKER_URL"] == "filesystem://localhost/"  # no Redis: the embedded broker
    assert got["ORS_SECRETS_TRUSTED_TEAMS"] == ["ops"]


def test_numbers_are_typed_and_bounded():
    got = config.load({"ORS_IDLE_TIMEOUT_SECONDS": "1.5", "ORS_MAX_CONNECTIONS": "100"})
    assert got["ORS_IDLE_TIMEOUT_SECONDS"] == 1.5 and got["ORS_MAX_CONNECTIONS"] == 100
    for name, raw in [("ORS_MAX_CONNECTIONS", "0"), ("ORS_MAX_CONNECTIONS", "1.5"),
                      ("ORS_IDLE_TIMEOUT_SECONDS", "nan"), ("ORS_IDLE_TIMEOUT_SECONDS", "soon")]:
        with pytest.raises(config.ConfigError, match=name):
            config.load({name: raw})


def test_the_sandbox_defaults_are_the_ones_its_supervisors_read_without_the_registry():
    from orsplatform.sandbox.config import DEFAULTS
    from orsplatform.sandbox.framing import DEFAULTS as CHANNEL

    got = config.load({})
    assert all(got[name] == value for name, value in {**DEFAULTS, **CHANNEL}.items())


def test_django_settings_carry_the_registry_values():
    assert settings.ORS_ANALYTICS_PASS_REWARD == 1.0  # documented, and now read
    assert settings.ORS_SANDBOX in ("auto", "gvisor", "bwrap", "none")


def test_the_configuration_page_is_the_one_the_registry_generates():
    page = (Path(ROOT) / "docs" / "configuration.md").read_text()
    assert page == config.markdown(), (
        "docs/configuration.md is stale: python -m orsplatform.config --markdown > docs/configuration.md")


def sources() -> dict[Path, str]:
    root = Path(ROOT)
    files = [*(root / "orsplatform").rglob("*.py"), *(root / "bin").iterdir(), *(root / "docker").rglob("*.yml")]
    return {path: path.read_text(errors="replace") for path in files
            if path.is_file() and path != root / "orsplatform" / "config.py"}


def test_every_registered_setting_is_read_by_something():
    text = "\n".join(sources().values())
    unread = [name for name in config.REGISTRY if not re.search(rf"\b{name}\b", text)]
    assert not unread, f"documented but read by nothing (remove them or read them): {unread}"


def test_every_variable_the_code_reads_is_registered():
    read = set()
    pattern = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|\benv\[|ENV\[)\s*["']([A-Z][A-Z0-9_]*)["'](?!\]\s*=[^=])""")  # reads, not writes
    for text in sources().values():
        read.update(pattern.findall(text))
    unregistered = sorted(read - set(config.REGISTRY) - NOT_SETTINGS)
    assert not unregistered, f"read but not in orsplatform/config.py: {unregistered}"


def test_a_misspelt_setting_is_warned_about_and_other_ors_variables_are_not():
    warnings = config.typos({"ORS_SANDBOXX": "none", "ORS_API_KEY": "ors_x", "ORS_NGINX_UPSTREAMS": "a:1"})
    assert warnings == ["ORS_SANDBOXX is not a setting (ignored); did you mean ORS_SANDBOX?"]


def test_manage_py_warns_about_a_misspelt_setting_and_still_starts():
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ(ORS_IDLE_TIMEOUT_SECOND="5"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "did you mean ORS_IDLE_TIMEOUT_SECONDS?" in done.stderr
