"""The platform's own code inside a sandbox: the few Django-free modules a sandboxed process runs
(the worker and its parts, the publish-time inspector, the prompt renderer, and the rules they
share: the package loader and the redaction), bound read-only under /ors/lib at their dotted names.

One copy of each rule: the worker imports the loader and the redaction the gateway uses, rather
than keeping copies of its own (they had drifted). Parent packages get this package's own
``__init__`` (a docstring, nothing imported) as their stand-in, so binding a module never runs
the real ``orsplatform/__init__.py`` or reaches Django. Files are found from their dotted names
relative to the tree this package sits in, so the list below is all that names a layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PACKAGE = __name__.rpartition(".")[0]  # this package's dotted name, whatever the tree calls it
ROOT = Path(__file__).resolve().parents[len(PACKAGE.split("."))]  # the folder holding `orsplatform`
STAND_IN_INIT = Path(__file__).with_name("__init__.py")
LIB = "/ors/lib"

# The rules every sandboxed process shares.
LOADER = "orsplatform.sandbox.loader"
REDACTION = "orsplatform.sandbox.redact"
OPENENV_HOST = f"{PACKAGE}.openenv_host"
# What each kind of sandboxed process runs, besides the package.
# The worker (worker.py) and its parts: a part left out here fails the worker's import in a sandbox.
WORKER_PARTS = (f"{PACKAGE}.worker_errors", f"{PACKAGE}.worker_host", f"{PACKAGE}.worker_sdks",
                f"{PACKAGE}.worker_strays", f"{PACKAGE}.worker_threads")
WORKER_MODULES = (f"{PACKAGE}.worker", *WORKER_PARTS, OPENENV_HOST, LOADER, REDACTION)
CHILD_MODULES = (LOADER, OPENENV_HOST)  # the inspector's and the prompt renderer's


def module_path(name: str, root: Path | str = ROOT) -> str:
    return str(Path(root, *name.split(".")).with_suffix(".py"))


def module_binds(modules: Iterable[str]) -> list[str]:
    """bubblewrap arguments binding `modules` (and stand-ins for their parent packages) under LIB."""
    binds: list[str] = []
    packages: set[str] = set()
    for name in dict.fromkeys(modules):
        parts = name.split(".")
        packages.update(".".join(parts[:i]) for i in range(1, len(parts)))
        binds += ["--ro-bind", module_path(name), module_path(name, LIB)]
    for package in sorted(packages):
        init = str(Path(LIB, *package.split("."), "__init__.py"))
        binds += ["--ro-bind", str(STAND_IN_INIT), init]
    return binds
