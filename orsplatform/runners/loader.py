"""Import an environment package's class by entrypoint. No Django here: the inspector subprocess
and runner processes use this too."""

from __future__ import annotations

import hashlib
import importlib
import sys
import threading
import types
from pathlib import Path

from ors import Environment

_lock = threading.Lock()
_classes: dict[tuple[str, str], type[Environment]] = {}


class EntrypointError(Exception):
    pass


def package_module_name(package_dir: str) -> str:
    # A unique top-level name per package directory, so two versions (or two tenants) that both
    # ship an `env.py` never share a module object.
    return "orspkg_" + hashlib.sha256(str(Path(package_dir).resolve()).encode()).hexdigest()[:16]


def load_environment_class(package_dir: str, entrypoint: str) -> type[Environment]:
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


def _import(package_dir: str, entrypoint: str) -> type[Environment]:
    module_path, sep, class_name = entrypoint.partition(":")
    if not sep or not module_path or not class_name:
        raise EntrypointError(f"Entrypoint {entrypoint!r} must look like 'module:Class'.")
    pkg_name = package_module_name(package_dir)
    if pkg_name not in sys.modules:
        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = [str(Path(package_dir).resolve())]
        sys.modules[pkg_name] = pkg
    module = importlib.import_module(f"{pkg_name}.{module_path}")
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise EntrypointError(f"{entrypoint!r} is not an ors.Environment subclass.")
    return cls
