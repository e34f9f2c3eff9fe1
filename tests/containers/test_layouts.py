"""Which packages are container environments, and where their server listens (no engine needed)."""

from __future__ import annotations

from orsplatform.containers.images import server_port
from orsplatform.containers.services import _openenv_port, has_dockerfile
from tests.catalog.support import write_folder

DOCKERFILE = "FROM python:3.11-slim\nCMD [\"python3\", \"app.py\"]\n"


def test_openenv_layouts_spaces_and_declared_runtimes_are_containers_and_python_packages_are_not(tmp_path):
    assert has_dockerfile(write_folder(tmp_path / "openenv", {"server/Dockerfile": DOCKERFILE}))
    assert has_dockerfile(write_folder(tmp_path / "yaml", {"Dockerfile": DOCKERFILE, "openenv.yaml": "name: x\n"}))
    space = {"Dockerfile": DOCKERFILE, "README.md": "---\ntitle: Env\nsdk: docker\napp_port: 7860\n---\n# Env\n"}
    assert has_dockerfile(write_folder(tmp_path / "space", space))
    declared = write_folder(tmp_path / "declared", {"Dockerfile": DOCKERFILE, "manifest.toml": 'runtime = "container"\n'})
    assert has_dockerfile(declared)
    # An ORS package that happens to carry a Dockerfile stays a Python package (its note says so).
    assert not has_dockerfile(write_folder(tmp_path / "ors", {"Dockerfile": DOCKERFILE, "env.py": "x = 1\n"}))
    assert not has_dockerfile(write_folder(tmp_path / "none", {"openenv.yaml": "name: x\n"}))


def test_the_server_port_is_the_commands_then_the_images_then_the_packages_then_8000(tmp_path):
    assert server_port(["uvicorn", "a:app", "--port", "9001"], ["PORT=9002"], 9003) == 9001
    assert server_port(["sh", "-c", "cd /app/env && uvicorn server.app:app --host 0.0.0.0 --port=9004"], [], None) == 9004
    assert server_port(["python3", "app.py"], ["PORT=9002"], 9003) == 9002
    assert server_port(["python3", "app.py"], [], 9003) == 9003
    assert server_port(["python3", "app.py"], [], None) == 8000
    space = write_folder(tmp_path / "space", {"README.md": "---\nsdk: docker\napp_port: 7860\n---\n"})
    assert _openenv_port(space) == 7860
    assert _openenv_port(write_folder(tmp_path / "yaml", {"openenv.yaml": "name: x\nport: 8100\n"})) == 8100
