#!/usr/bin/env python3
"""Run the tests that touch what a change modified: the inner loop (`make test-changed`).

    python tools/test_changed.py                 # run them (pytest, several workers when there are many)
    python tools/test_changed.py --list          # only name them, one test file a line, and why
    python tools/test_changed.py --base REV      # what changed since REV (default: where HEAD left main)
    python tools/test_changed.py -- -x -k name   # anything after -- goes to pytest

The change is everything since the base: commits, uncommitted edits and new files git does not
ignore. A test file is chosen, by reading the source (nothing is imported or run to decide), when:

- it changed itself, or a conftest.py above it did;
- it imports a changed module, directly or through other modules of the repository (the import
  graph of orsplatform/ and tests/, imports inside functions included);
- it asks for a fixture (by name) of a changed module of tests/fixtures/, or of one that imports a
  changed module;
- the change is in orsplatform/APP/ (a module, a template, a static file): every test of tests/APP/,
  where the tests of an app live (requests reach views through URLs, which no import shows);
- it names a changed file that is not Python (a document, the Makefile, a bundled environment) by
  its path, or it is tests/test_docs_site.py and docs/ or mkdocs.yml changed.

A change to tests/conftest.py, pyproject.toml or the migrations of an app runs everything: they
reach every test. This is a selection for speed, not a proof: `make test` stays the contract.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from house import ROOT, _targets  # noqa: E402

EVERYTHING = ("tests/conftest.py", "pyproject.toml", "tests/fixtures/database.py", "tests/fixtures/tiers.py",
              "tests/fixtures/workers.py")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def default_base() -> str:
    for ref in ("main", "origin/main"):
        try:
            return git("merge-base", "HEAD", ref).strip()
        except subprocess.CalledProcessError:
            continue
    return "HEAD"


def changed_files(base: str) -> set[str]:
    names = set(git("diff", "--name-only", base).split())
    names |= set(git("ls-files", "--others", "--exclude-standard").split())
    return names


def module_name(rel: str) -> str:
    parts = Path(rel).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for top in ("orsplatform", "tests"):
        for path in (ROOT / top).rglob("*.py"):
            found[module_name(path.relative_to(ROOT).as_posix())] = path
    return found


@cache
def imports(module: str) -> frozenset[str]:
    path = modules()[module]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return frozenset()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(module, path, node):
                while target and target not in modules():
                    target = target.rpartition(".")[0]
                if target and target != module:
                    found.add(target)
    return frozenset(found)


def closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(imports(current))
    return seen


@cache
def fixtures_of(module: str) -> frozenset[str]:
    """The names of the fixtures a module of tests/fixtures defines."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                "fixture" in ast.unparse(d) for d in node.decorator_list):
            names.add(node.name)
    return frozenset(names)


def test_files() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
                  if "stack" not in p.relative_to(ROOT).parts[:2])


def reasons_for(test: str, changed: set[str]) -> list[str]:
    """Why ``test`` touches the change (empty: it does not)."""
    changed_modules = {module_name(c) for c in changed if c.endswith(".py") and module_name(c) in modules()}
    text = (ROOT / test).read_text(encoding="utf-8")
    why = []
    if test in changed:
        why.append("changed itself")
    folder = Path(test).parent
    conftests = [(p / "conftest.py").as_posix() for p in [folder, *folder.parents] if p.as_posix() != "."]
    sources = [module_name(test)] + [module_name(c) for c in conftests if (ROOT / c).is_file()]
    reached = set().union(*(closure(s) for s in sources))
    for fixture_module in (m for m in modules() if m.startswith("tests.fixtures.")):
        if any(re.search(rf"\b{name}\b", text) for name in fixtures_of(fixture_module)):
            reached |= closure(fixture_module)
    why += [f"imports {m}" for m in sorted(reached & changed_modules)]
    why += [f"conftest {c} changed" for c in conftests if c in changed]
    app = folder.parts[1] if len(folder.parts) > 1 else None
    if app and any(c.startswith(f"orsplatform/{app}/") for c in changed):
        why.append(f"tests of orsplatform/{app}/")
    for other in sorted(c for c in changed if not c.endswith(".py")):
        if other in text or (test == "tests/test_docs_site.py" and (other.startswith("docs/") or other == "mkdocs.yml")):
            why.append(f"names {other}")
    return why


def select(changed: set[str]) -> dict[str, list[str]]:
    if any(c in EVERYTHING or "/migrations/" in c for c in changed):
        return {test: ["the change reaches every test"] for test in test_files()}
    return {test: why for test in test_files() if (why := reasons_for(test, changed))}


def main(argv: list[str]) -> int:
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None, help="what changed since this revision (default: merge-base with main)")
    parser.add_argument("--list", action="store_true", help="name the test files and why, run nothing")
    parser.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "3"),
                        help="pytest-xdist workers when more than a few files are chosen")
    args = parser.parse_args(own)
    base = args.base or default_base()
    changed = changed_files(base)
    chosen = select(changed)
    if args.list or not chosen:
        print(f"{len(changed)} files changed since {base[:12]}; {len(chosen)} test files touch them")
        for test, why in chosen.items():
            print(f"{test}  ({'; '.join(why[:3])}{'; …' if len(why) > 3 else ''})")
        return 0
    workers = ["-n", args.workers] if len(chosen) > 3 and args.workers not in ("0", "1") else []
    command = [sys.executable, "-m", "pytest", *workers, *extra, *chosen]
    print(f"{len(changed)} files changed since {base[:12]}: {len(chosen)} test files", flush=True)
    return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
