"""Publishing tests store packages and uploads under the test's tmp_path, so a test can check what
was (not) left on disk."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def package_dirs(settings, tmp_path):
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"
    settings.ORS_UPLOAD_DIR = tmp_path / "uploads"
    return settings.ORS_PACKAGE_DIR, settings.ORS_UPLOAD_DIR


def stored_packages(settings) -> list:
    root = settings.ORS_PACKAGE_DIR
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def leftover_uploads(settings) -> list:
    root = settings.ORS_UPLOAD_DIR
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture(scope="session")
def pyenv_root(tmp_path_factory):
    """Where packages' Python environments are built: one folder for the whole run (later tests
    reuse what earlier ones built, as a platform does), never the checkout's var/."""
    return tmp_path_factory.mktemp("pyenvs")


@pytest.fixture(autouse=True)
def build_dirs(settings, pyenv_root, tmp_path):
    """The build settings, and the same as environment variables for a server subprocess."""
    settings.ORS_PYENV_DIR = pyenv_root
    settings.ORS_UV_CACHE_DIR = pyenv_root / ".uv-cache"
    settings.ORS_BUILD_LOG_DIR = tmp_path / "builds"
    return {"ORS_PYENV_DIR": str(pyenv_root), "ORS_UV_CACHE_DIR": str(pyenv_root / ".uv-cache"),
            "ORS_BUILD_LOG_DIR": str(tmp_path / "builds"), "ORS_PACKAGE_DIR": str(settings.ORS_PACKAGE_DIR)}
