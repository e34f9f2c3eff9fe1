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
