"""Where containers cannot run (no engine answers), a container version fails its build with a
message saying why, and Python environments publish and run as before."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.containers import worker as container_worker
from tests.catalog.support import ADDER_ORS, write_folder
from tests.containers.conftest import package_files


def test_without_an_engine_a_container_version_fails_saying_why_and_python_ones_publish(
        tmp_path, monkeypatch, owner, build_dirs):
    monkeypatch.setenv("ORS_DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setattr(container_worker, "_engine", None)  # this process's share, taken anew
    with pytest.raises(CommandError, match="cannot build or run container environments"):
        call_command("publish_env", str(write_folder(tmp_path / "ledger", package_files("ledger_env"))),
                     team="acme", slug="ledger")
    version = EnvironmentVersion.objects.get(environment__team__slug="acme", environment__slug="ledger", number=1)
    assert version.status == EnvironmentVersion.Status.FAILED
    assert version.error.startswith("containers: This platform cannot build or run container environments: "
                                    "The Docker engine at ORS_DOCKER_HOST does not answer."), version.error
    assert "Python environments are not affected" in version.error
    assert "[platform] failed (containers)" in log_path(version.id).read_text()

    call_command("publish_env", str(write_folder(tmp_path / "adder", {"env.py": ADDER_ORS})), team="acme",
                 slug="adder")
    adder = EnvironmentVersion.objects.get(environment__team__slug="acme", environment__slug="adder", number=1)
    assert adder.status == EnvironmentVersion.Status.READY, adder.error
