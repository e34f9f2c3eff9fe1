"""The sandbox package is Django-free and stands alone: it, and every module it binds into a
sandbox, imports nothing from Django nor from the rest of orsplatform (binding.py's list aside),
at module level or inside a function. Read from the source (ast), so an import on a rarely taken
path counts too."""

from __future__ import annotations

import ast
from pathlib import Path

from orsplatform.sandbox import binding
from orsplatform.sandbox.inspect import CHILDREN

PACKAGE_DIR = Path(binding.__file__).parent
BOUND = {binding.LOADER, binding.REDACTION, *CHILDREN.values()}


def imported(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def allowed(name: str) -> bool:
    if name == "django" or name.startswith("django."):
        return False
    if name != "orsplatform" and not name.startswith("orsplatform."):
        return True
    return (name.startswith(binding.PACKAGE + ".") or name == binding.PACKAGE
            or any(name == b or name.startswith(b + ".") or b.startswith(name + ".") for b in BOUND))


def test_the_sandbox_package_and_what_it_binds_import_nothing_of_django_or_the_platform():
    files = sorted(PACKAGE_DIR.glob("*.py")) + [Path(binding.module_path(m)) for m in sorted(BOUND)]
    assert len(files) > 10
    wrong = {str(f.relative_to(binding.ROOT)): bad for f in files
             if (bad := [n for n in imported(f) if not allowed(n)])}
    assert wrong == {}


def test_every_module_a_sandbox_is_given_exists_and_sits_where_its_name_says():
    for name in (*binding.WORKER_MODULES, *binding.CHILD_MODULES, *CHILDREN.values()):
        assert Path(binding.module_path(name)).is_file(), name
    binds = binding.module_binds(binding.WORKER_MODULES)
    targets = binds[2::3]
    assert f"{binding.LIB}/orsplatform/__init__.py" in targets
    assert all(t.startswith(binding.LIB + "/orsplatform/") for t in targets)


def test_every_platform_module_the_worker_imports_is_bound_into_its_sandbox():
    # The worker and its parts (worker_host.py, worker_sdks.py, ...) import each other by name; one
    # missing from WORKER_MODULES imports outside a sandbox and fails inside one.
    reached, todo = set(), [f"{binding.PACKAGE}.worker"]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [n for n in imported(Path(binding.module_path(name)))
                 if n.startswith("orsplatform.") and Path(binding.module_path(n)).is_file()]
    assert {f"{binding.PACKAGE}.worker_host", f"{binding.PACKAGE}.worker_threads"} <= reached
    assert reached - set(binding.WORKER_MODULES) == set()
