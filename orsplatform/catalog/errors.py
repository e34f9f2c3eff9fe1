"""Publishing errors as their authors should read them: what failed, in one line with the check's
name, and tracebacks with the package's own frames only (paths relative to the package root),
never the platform's paths or frames.

The inspector (sandbox/inspector.py) filters the tracebacks it reports itself; what is filtered
here is text the platform only has as text: the tail of a validation process's output when it was
killed or died without a report.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

from django.conf import settings

from orsplatform.sandbox.inspect import PACKAGE

FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+')
SYNTHETIC = re.compile(r"orspkg_[0-9a-f]{16}\.?")


def _prefixes(package_dirs: list[str]) -> list[tuple[str, str]]:
    pairs = [(d.rstrip("/") + "/", "") for d in package_dirs]
    for path in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sys.prefix,
                 sys.base_prefix, sysconfig.get_paths()["stdlib"]}:
        pairs.append((path + "/", "<python>/"))
    pairs.append((str(settings.BASE_DIR) + "/", "<platform>/"))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def tenant_output(text: str, package_dir: Path | str) -> str:
    """``text`` (a process's output) with traceback frames outside the package dropped (with the
    source line under each) and platform paths replaced."""
    roots = [str(Path(package_dir).resolve()), str(package_dir), PACKAGE]
    inside = tuple(r.rstrip("/") + "/" for r in roots)
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        frame = FRAME.match(line)
        if frame:
            skipping = not frame.group("path").startswith(inside)
            if skipping:
                continue
        elif skipping and line.startswith("    "):
            continue  # the source line (and carets) of a dropped frame
        else:
            skipping = False
        kept.append(line)
    out = "\n".join(kept)
    for prefix, replacement in _prefixes(roots):
        out = out.replace(prefix, replacement)
    return SYNTHETIC.sub("", out)


def one_line(text: str) -> str:
    return " ".join(str(text).split())
