"""The documentation site builds with `mkdocs build --strict`: every relative link and anchor resolves and
every page is in the nav. The README stays a two-screen front page that points into the site."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fixtures.server import ROOT

REPO = Path(ROOT)


# Not --quiet: it hides the warnings that --strict counts, and the build would pass with them.
def build(config_dir: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=config_dir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_in_strict_mode(tmp_path):
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    assert build(copy, tmp_path / "a").returncode != 0
    page.write_text(page.read_text().replace("[nowhere](no-such-page.md)", ""))
    (copy / "docs" / "orphan.md").write_text("# Not in the nav\n")
    assert build(copy, tmp_path / "b").returncode != 0


def test_the_readme_fits_two_screens_and_links_into_the_site():
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) < 10 * 1024
    for page in ("getting-started", "trainers", "authors", "operators", "rest-api", "configuration"):
        assert f"docs/{page}.md" in readme


def test_the_benchmark_readme_points_at_the_figures_instead_of_holding_them():
    text = (REPO / "bench" / "README.md").read_text()
    assert "docs/benchmarks.md" in text and len(text.encode()) < 12 * 1024
