"""Import an environment package's class by entrypoint. No Django here, and nothing of the platform
imported: the sandbox worker, the publishing inspector and the prompt renderer all import this
module in their sandboxes (sandbox/binding.py binds it there), so what publishing
accepted is imported by the very same rules in every session.

Environments are written against ``ors`` (ors-sdk), ``openreward.environments`` (openreward) or
OpenEnv's ``openenv.core`` (its ``Environment`` / ``MCPEnvironment``, hosted through
sandbox/openenv_host.py). Each is recognised by its ``Environment`` base class.

A package is imported the way ``python server.py`` sees it, with one difference: its modules live
under a synthetic top-level package of their own (``orspkg_<hash>``), so relative imports work in
any module. ``import utils`` / ``from mypkg import x`` (absolute imports of the package's own
modules, from the package root or from ``src/``) resolve to those same module objects, so a module
is never imported twice under two names. Modules are imported under their own names, never as
``__main__``: an ``if __name__ == "__main__": Server([...]).run()`` block does not run.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from pathlib import Path

# Where each SDK's Environment base class is defined; looked up in sys.modules, since a tenant's
# class can only subclass an SDK it has imported.
SDK_MODULES = {"ors.environment": "ors", "openreward.environments.environment": "openreward",
               "openenv.core.env_server.interfaces": "openenv"}

_lock = threading.Lock()
_classes: dict[tuple[str, str], type] = {}


class EntrypointError(Exception):
    pass


def package_module_name(package_dir: str) -> str:
    # A unique top-level name per package directory, so two versions (or two tenants) that both
    # ship an `env.py` never share a module object.
    return "orspkg_" + hashlib.sha256(str(Path(package_dir).resolve()).encode()).hexdigest()[:16]


def sdk_bases() -> dict[type, str]:
    """The Environment base classes of the SDKs imported so far, with the SDK's name."""
    bases: dict[type, str] = {}
    for module_name, sdk in SDK_MODULES.items():
        module = sys.modules.get(module_name)
        base = getattr(module, "Environment", None) if module is not None else None
        if isinstance(base, type):
            bases[base] = sdk
    return bases


def sdk_base(cls: object) -> type | None:
    """The SDK Environment base class ``cls`` derives from (None when it is no environment class, or
    is an SDK's base itself)."""
    if not isinstance(cls, type):
        return None
    for base in sdk_bases():
        if cls is not base and issubclass(cls, base):
            return base
    return None


def package_roots(package_dir: str) -> list[str]:
    """Where the package's own modules are found: its root, and ``src/`` when there is one."""
    root = Path(package_dir).resolve()
    roots = [str(root)]
    if (root / "src").is_dir() and not (root / "src" / "__init__.py").exists():
        roots.append(str(root / "src"))
    return roots


def top_level_names(roots: list[str]) -> set[str]:
    """Modules and packages an absolute import may name: ``x.py`` and folders holding Python files."""
    names: set[str] = set()
    for root in roots:
        for path in Path(root).iterdir():
            if path.suffix == ".py" and path.stem.isidentifier():
                names.add(path.stem)
            elif path.is_dir() and path.name.isidentifier() and any(path.glob("*.py")):
                names.add(path.name)
    return names


class _Alias(importlib.abc.Loader):
    """Loads ``name`` as the module ``target``: the import system returns whatever the loader left
    in sys.modules under the name, so both names share one module object."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.target)


class PackageImports(importlib.abc.MetaPathFinder):
    """Absolute imports of a package's own modules (``from utils import x``, as ``python server.py``
    allows) resolve to the modules of its synthetic package."""

    def __init__(self, pkg_name: str, names: set[str]) -> None:
        self.pkg_name = pkg_name
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"{self.pkg_name}.{fullname}"))


def defer_openreward_init() -> None:
    """``import openreward.environments`` first runs ``openreward/__init__.py``, which imports the
    SDK's whole API client (openai, anthropic: seconds of start-up in every worker). Environments
    use the subpackage only, so the parent is registered bare; its ``__init__`` runs, as it would
    have, on the first name asked of it (``from openreward import OpenReward``)."""
    if "openreward" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("openreward")
    except (ImportError, ValueError):
        return
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)
    ran = [False]

    def __getattr__(name: str):
        if ran[0] or name.startswith("__"):
            raise AttributeError(f"module 'openreward' has no attribute {name!r}")
        ran[0] = True
        spec.loader.exec_module(module)
        return getattr(module, name)

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    sys.modules["openreward"] = module


def register_package(package_dir: str) -> str:
    """The package's synthetic top-level module (made once per process), and the finder for its
    absolute imports."""
    name = package_module_name(package_dir)
    if name not in sys.modules:
        defer_openreward_init()
        roots = package_roots(package_dir)
        pkg = types.ModuleType(name)
        pkg.__path__ = roots
        sys.modules[name] = pkg
        sys.meta_path.insert(0, PackageImports(name, top_level_names(roots)))
    return name


def load_environment_class(package_dir: str, entrypoint: str) -> type:
    key = (package_dir, entrypoint)
    cls = _classes.get(key)
    if cls is not None:
        return cls
    with _lock:
        cls = _classes.get(key)
        if cls is None:
            cls = _import(package_dir, entrypoint)
            _classes[key] = cls
    return cls


def _import(package_dir: str, entrypoint: str) -> type:
    module_path, sep, class_name = entrypoint.partition(":")
    if not sep or not module_path or not class_name:
        raise EntrypointError(f"Entrypoint {entrypoint!r} must look like 'module:Class'.")
    pkg_name = register_package(package_dir)
    module = importlib.import_module(f"{pkg_name}.{module_path}")
    cls = getattr(module, class_name, None)
    if sdk_base(cls) is None:
        raise EntrypointError(f"{entrypoint!r} is not an Environment subclass (ors.Environment, "
                              "openreward.environments.Environment or openenv's Environment).")
    return cls
