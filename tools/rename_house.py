#!/usr/bin/env python3
"""Move the packages to names that say what they hold, and rewrite every reference (issue 29, part 6).

    python tools/rename_house.py            # in the repository's root: moves, rewrites, prints
    python tools/rename_house.py --dry-run  # prints what it would do

Operates on whatever tree it finds (other branches merged in): files are moved with ``git mv``
(a folder whose new home already exists is merged file by file), then every tracked or untracked,
not ignored, text file is rewritten: dotted names (``orsplatform.gateway.calls``), paths
(``orsplatform/runners/sandbox/pool.py``, and the short ``runners/inline.py``, ``gateway/calls.py``
forms of comments and docs) and ``from PACKAGE import module`` statements whose modules moved
elsewhere than their package (split into one statement per new package; a module imported under a
new name has its uses in that file renamed too). Idempotent: a second run finds nothing to do.

What stays: Django app labels (``runners`` keeps its label in executors/apps.py; no model moves, so
no migration), database tables, Celery task names (``runners.node.call``... are explicit names, not
module paths: messages already queued still route), Redis keys, URLs.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Old dotted name -> new, most specific first (the first match of a name's longest prefix wins).
MODULES: list[tuple[str, str]] = [
    # The Django-free sandbox package, with the rules and children it binds into a sandbox.
    ("orsplatform.runners.sandbox", "orsplatform.sandbox"),
    ("orsplatform.runners.loader", "orsplatform.sandbox.loader"),
    ("orsplatform.runners.redact", "orsplatform.sandbox.redact"),
    ("orsplatform.runners.inspector", "orsplatform.sandbox.inspector"),
    ("orsplatform.runners.prompt_render", "orsplatform.sandbox.prompt_render"),
    # The executors (inline, celery: remote + runner nodes) and the episode engine.
    ("orsplatform.runners", "orsplatform.executors"),
    ("orsplatform.gateway", "orsplatform.engine"),
    # The faces' modules that were named like the `episodes` app, and the two "publishing" faces
    # (the third, catalog/services.py, is where publishing lives and keeps its name).
    ("orsplatform.ors.episodes", "orsplatform.ors.lifecycle"),
    ("orsplatform.openenv.episodes", "orsplatform.openenv.sessions"),
    ("orsplatform.api.publishing", "orsplatform.api.catalog"),
    ("orsplatform.console.publishing", "orsplatform.console.environments"),
    # Tests mirror the packages.
    ("tests.runners", "tests.executors"),
    ("tests.gateway", "tests.engine"),
]
# Folders whose files a short path in a comment or doc is relative to (``gateway/calls.py``).
SHORT_ROOTS = ("runners", "gateway", "ors", "openenv", "api", "console")
# Bare folder mentions in prose (`gateway/`, `runners/`).
BARE_FOLDERS = {"gateway": "engine", "runners": "executors"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".txt", ".html", ".sh", ".json",
                 ".conf", ".service", ".j2", ".in", ".rst", ".css", ".js"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run", "Procfile", ".dockerignore", ".gitignore"}
# Files that describe the rename itself, in the old names on purpose.
KEEP = {"tools/rename_house.py", "docs/architecture.md"}


def new_name(dotted: str) -> str:
    for old, new in MODULES:
        if dotted == old or dotted.startswith(old + "."):
            return new + dotted[len(old):]
    return dotted


def module_file(dotted: str, root: Path) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    if base.is_dir():
        return base
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


# --- moves -----------------------------------------------------------------------------------------


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def tracked(root: Path, path: Path) -> bool:
    return bool(git(root, "ls-files", "--", str(path.relative_to(root))).strip())


def move(root: Path, src: Path, dst: Path, dry: bool, log: list[str]) -> None:
    rel = lambda p: str(p.relative_to(root))  # noqa: E731
    if src.is_dir():
        for cache in src.rglob("__pycache__"):
            if not dry:
                shutil.rmtree(cache, ignore_errors=True)
        if not dst.exists():
            log.append(f"move  {rel(src)}/ -> {rel(dst)}/")
            if not dry:
                dst.parent.mkdir(parents=True, exist_ok=True)
                git(root, "mv", rel(src), rel(dst))
            return
        # Both exist (a branch added files under the old name after the rename): merge file by file.
        for child in sorted(src.iterdir()):
            move(root, child, dst / child.name, dry, log)
        if not dry and src.exists() and not any(src.iterdir()):
            src.rmdir()
        return
    if dst.exists():
        if src.read_bytes() == dst.read_bytes():
            log.append(f"same  {rel(src)} == {rel(dst)}: old copy removed")
            if not dry:
                git(root, "rm", "-q", "-f", rel(src)) if tracked(root, src) else src.unlink()
        else:
            log.append(f"CONFLICT {rel(src)} and {rel(dst)} both exist and differ: left for a person")
        return
    log.append(f"move  {rel(src)} -> {rel(dst)}")
    if not dry:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if tracked(root, src):
            git(root, "mv", rel(src), rel(dst))
        else:
            src.rename(dst)


def do_moves(root: Path, dry: bool, log: list[str]) -> None:
    for old, new in MODULES:
        src = module_file(old, root)
        if src is None:
            continue  # moved already (or never there)
        dst = root.joinpath(*new.split("."))
        if src.suffix == ".py":
            dst = dst.with_suffix(".py")
        move(root, src, dst, dry, log)


# --- rewrites --------------------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w.])((?:orsplatform|tests)(?:\.\w+)+)")
PATH = re.compile(r"(?<![\w.-])((?:orsplatform|tests)(?:/[\w.]+)+/?)")
SHORT = re.compile(r"(?<![\w/.-])((?:" + "|".join(SHORT_ROOTS) + r")(?:/\w+)*/\w+\.py)\b")
BARE = re.compile(r"(?<![\w/.-])(" + "|".join(BARE_FOLDERS) + r")/(?![\w.])")
FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<pkg>(?:orsplatform|tests)(?:\.\w+)*) import "
    r"(?:\((?P<multi>[^)]*)\)|(?P<single>[^\n#(]+?))(?P<tail>[ \t]*(?:#[^\n]*)?)$", re.M)


def map_path(path: str) -> str:
    """A path's module part mapped (``orsplatform/runners/sandbox/seccomp.py`` ->
    ``orsplatform/sandbox/seccomp.py``); a file's extension and a trailing / are kept."""
    trailing = "/" if path.endswith("/") else ""
    parts = path.rstrip("/").split("/")
    stem, dot, ext = parts[-1].partition(".")
    dotted = ".".join([*parts[:-1], stem])
    mapped = new_name(dotted)
    if mapped == dotted:
        return path
    return mapped.replace(".", "/") + (dot + ext) + trailing


def rewrite_path(match: re.Match) -> str:
    return map_path(match.group(1))


def rewrite_short(match: re.Match) -> str:
    mapped = map_path("orsplatform/" + match.group(1))
    return match.group(1) if mapped == "orsplatform/" + match.group(1) else mapped.removeprefix("orsplatform/")


def rewrite_from_imports(text: str) -> tuple[str, dict[str, str]]:
    """``from P import a, b``: names whose module moves elsewhere than P's new name go to a statement
    of their own new package. Returns the text and {old local name: new local name}."""
    renamed: dict[str, str] = {}

    def one(match: re.Match) -> str:
        pkg = match.group("pkg")
        body = match.group("multi") if match.group("multi") is not None else match.group("single")
        names = [n.strip() for n in body.replace("\n", " ").split(",") if n.strip()]
        groups: dict[str, list[str]] = {}
        changed = False
        for item in names:
            name, _, alias = item.partition(" as ")
            name = name.strip()
            target = new_name(f"{pkg}.{name}")
            default = f"{new_name(pkg)}.{name}"
            if target != default:
                changed = True
                parent, _, leaf = target.rpartition(".")
                if leaf != name and not alias:
                    renamed[name] = leaf
                groups.setdefault(parent, []).append(f"{leaf} as {alias.strip()}" if alias else leaf)
            else:
                groups.setdefault(pkg, []).append(item)
        if not changed:
            return match.group(0)
        indent, tail = match.group("indent"), match.group("tail") or ""
        lines = []
        for parent, items in sorted(groups.items()):
            items = sorted(set(items), key=lambda s: s.split(" as ")[0])
            line = f"{indent}from {parent} import {', '.join(items)}"
            if len(line) > 110:
                line = f"{indent}from {parent} import (\n" + "".join(f"{indent}    {i},\n" for i in items) + f"{indent})"
            lines.append(line)
        lines[-1] += tail
        return "\n".join(lines)

    text = FROM_IMPORT.sub(one, text)
    for old, new in renamed.items():
        # The module's uses in this file (`episodes.create` -> `lifecycle.create`), never an
        # attribute of something else (`orsplatform.episodes.models`).
        text = re.sub(rf"(?<![\w.]){re.escape(old)}\.(?=[A-Za-z_])", f"{new}.", text)
    return text, renamed


def rewrite(text: str) -> str:
    text, _ = rewrite_from_imports(text)
    text = DOTTED.sub(lambda m: new_name(m.group(1)), text)
    text = PATH.sub(rewrite_path, text)
    text = SHORT.sub(rewrite_short, text)
    text = BARE.sub(lambda m: BARE_FOLDERS[m.group(1)] + "/", text)
    return text


def text_files(root: Path) -> list[Path]:
    listed = git(root, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    files = []
    for rel in listed:
        if not rel or rel in KEEP:
            continue
        path = root / rel
        if path.is_file() and not path.is_symlink() and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES
                                                         or rel.startswith("bin/")):
            files.append(path)
    return files


def sort_imports(root: Path, files: list[Path], log: list[str]) -> None:
    """New module names sort differently (`gateway` -> `engine`): the import blocks of the rewritten
    Python files are re-sorted by ruff (the project's linter) when it is installed."""
    if not files:
        return
    candidates = [shutil.which("ruff"), Path(sys.executable).with_name("ruff"), root / ".venv" / "bin" / "ruff"]
    ruff = next((str(c) for c in candidates if c and Path(c).exists()), None)
    if ruff is None:
        log.append("note  ruff not found: import blocks left as rewritten (run `ruff check --fix --select I`)")
        return
    subprocess.run([ruff, "check", "--fix", "--select", "I", "--quiet", *map(str, files)], cwd=root,
                   capture_output=True)
    log.append(f"sort  imports of {len(files)} rewritten Python files (ruff --select I)")


def do_rewrites(root: Path, dry: bool, log: list[str]) -> None:
    rewritten: list[Path] = []
    for path in text_files(root):
        try:
            old = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite(old)
        if new != old:
            changed = sum(a != b for a, b in zip(old.splitlines(), new.splitlines(), strict=False))
            log.append(f"edit  {path.relative_to(root)} ({changed} lines)")
            if not dry:
                path.write_text(new, encoding="utf-8")
                rewritten.append(path)
    if not dry:
        sort_imports(root, [p for p in rewritten if p.suffix == ".py"], log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    root = args.root.resolve()
    log: list[str] = []
    do_moves(root, args.dry_run, log)
    do_rewrites(root, args.dry_run, log)
    for line in log:
        print(line)
    conflicts = [line for line in log if line.startswith("CONFLICT")]
    print(f"{'would do' if args.dry_run else 'done'}: {sum(e.startswith(('move', 'same')) for e in log)} moves, "
          f"{sum(e.startswith('edit') for e in log)} files rewritten, {len(conflicts)} conflicts"
          + ("" if log else " (nothing to do: already renamed)"))
    return 1 if conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
