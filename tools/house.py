#!/usr/bin/env python3
"""The house's size and shape limits, checked from the source (tests/test_house.py runs it in the fast tier).

    python tools/house.py            # what breaks a limit; exit 1 when something not allowed below does
    python tools/house.py --stale    # also the allowances below that are no longer needed

- every module (tracked ``.py`` file, migrations aside) under MODULE_LINES lines;
- every function under FUNCTION_LINES lines (from its ``def`` to its last line, decorators aside);
- no import circle among the modules of ``orsplatform`` (imports inside functions count too: a
  circle that only works because one side imports late is still a circle).

A limit says where a module holds two things or a function does two jobs; the split goes by what it
holds, not by size alone. ALLOWED names what is over a limit today and who splits it: each entry is
removed by the change that splits it (``--stale`` lists those that can go), and a new entry needs a
reason as good as these.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 600
FUNCTION_LINES = 80

# Over a limit today, owned by the work streams that are splitting them (their issues), or kept on
# purpose. Keys: a module's path, or "path::function" (a method: "path::Class.method").
ALLOWED: dict[str, str] = {
    "tests/executors/test_database_restart.py::test_a_database_restart_under_load_fails_requests_fast_and_"
    "recovers_without_a_restart": "the executors stream's test; one scenario told in order",
    # Benchmark scripts (not product code, not run by the suite): their seeding reads as one story.
    "bench/analytics_bench.py::seed": "benchmark seeding, to split",
    "bench/analytics_bench.py::main": "benchmark driver, to split",
    "bench/hold_ors.py::hold": "benchmark driver, to split",
    "bench/run_pages.py::seed": "benchmark seeding, to split",
}


@dataclass(frozen=True)
class Breach:
    key: str
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.key}: {self.lines} lines (limit {self.limit})"


def python_files(root: Path = ROOT) -> list[Path]:
    """The tracked Python files (and new ones git does not ignore), migrations aside."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=root, capture_output=True, text=True, check=True).stdout.split()
    return [root / name for name in sorted(set(listed))
            if "migrations" not in Path(name).parts and (root / name).is_file()]


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def breaches(files: list[Path], root: Path = ROOT) -> list[Breach]:
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if (lines := len(text.splitlines())) > MODULE_LINES:
            found.append(Breach(rel, lines, MODULE_LINES))
        for name, node in _functions(ast.parse(text, rel)):
            if (lines := node.end_lineno - node.lineno + 1) > FUNCTION_LINES:
                found.append(Breach(f"{rel}::{name}", lines, FUNCTION_LINES))
    return found


def _module_names(package: Path) -> dict[str, Path]:
    names = {}
    for path in package.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        rel = path.relative_to(package.parent).with_suffix("")
        names[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return names


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in it, functions too)."""
    names = _module_names(package)
    graph: dict[str, set[str]] = {name: set() for name in names}
    for module, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(module, path, node):
                while target and target not in names:
                    target = target.rpartition(".")[0]
                # A package's own __init__ is not a circle with its submodules importing it.
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def main(argv: list[str]) -> int:
    found = breaches(python_files())
    unallowed = [b for b in found if b.key not in ALLOWED]
    circles = import_circles(import_graph(ROOT / "orsplatform"))
    for breach in found:
        print(f"{'allowed' if breach.key in ALLOWED else 'OVER'}  {breach}"
              + (f"  ({ALLOWED[breach.key]})" if breach.key in ALLOWED else ""))
    for circle in circles:
        print(f"CIRCLE  {' -> '.join(circle)}")
    if "--stale" in argv:
        keys = {b.key for b in found}
        for key in sorted(set(ALLOWED) - keys):
            print(f"stale allowance (remove it from tools/house.py): {key}")
    print(f"{len(unallowed)} over a limit without an allowance, {len(circles)} import circles")
    return 1 if unallowed or circles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
