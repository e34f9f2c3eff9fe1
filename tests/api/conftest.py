"""The REST API tests publish too: packages, uploads and builds under the test's tmp_path, as in
tests/catalog, never the checkout's var/."""

from tests.catalog.conftest import build_dirs, package_dirs, pyenv_root

__all__ = ["build_dirs", "package_dirs", "pyenv_root"]
