"""The row check of a task upload: a sample of its rows run through the environment the way a
session starts (the class built on the task, ``setup()``, ``get_prompt()``, ``teardown()``), in the
sandbox, before the upload is committed. A row with ``txt`` where the code reads ``row["text"]`` is
then refused at upload, naming its row, its line, the field and the author's own traceback, instead
of failing as ``KeyError: 'txt'`` in the first session.

The sample: ORS_TASK_CHECK_ROWS rows (0: no check), always the first and the others drawn at random
from the whole file while it streams (reservoir sampling: one pass, the sample's memory only).

The child is the publishing inspector (sandbox/inspector.py, ``check_rows``) run by
executors/inspection.py: the workers' sandbox, no secrets, its limits, its process group killed at the
end. What comes back is the package's own frames only; values of the split's hidden fields (every
value of a sealed split's row) are then blanked from the messages, since an ingest job's report is
read by every member of the team and by any of its keys, not only by its publishers.
"""

from __future__ import annotations

import difflib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings

from orsplatform.catalog.models import EnvironmentVersion, Split
from orsplatform.executors.inspection import Results, run_child

HIDDEN = "[hidden]"
MIN_BLANKED = 2  # shorter values (a digit) would blank line numbers, and tell little


@dataclass
class Sampler:
    """Keeps the first row and a uniform random sample of the others, as rows stream past."""

    size: int
    rng: random.Random = field(default_factory=random.Random)
    seen: int = 0
    first: tuple[int, int, bytes] | None = None
    others: list[tuple[int, int, bytes]] = field(default_factory=list)

    def __call__(self, position: int, line: int, text: bytes) -> None:
        if self.size <= 0:
            return
        if self.first is None:
            self.first = (position, line, text)
            return
        self.seen += 1
        room = self.size - 1
        if len(self.others) < room:
            self.others.append((position, line, text))
        else:
            slot = self.rng.randrange(self.seen)
            if slot < room:
                self.others[slot] = (position, line, text)

    def rows(self) -> list[tuple[int, int, bytes]]:
        return ([self.first] if self.first else []) + sorted(self.others)


@dataclass(frozen=True)
class RowCheck:
    sampled: int
    failures: list[dict]  # {"row", "line", "field", "error", "traceback"}
    skipped: str = ""  # why no row was run (no version is served yet), else ""
    # Why the check stopped before its last row (its time limit, its process killed): a warning,
    # never a refusal by itself, so a loaded machine does not refuse good files.
    incomplete: str = ""

    def as_report(self) -> dict:
        return {"sampled": self.sampled, "failed": len(self.failures), "failures": self.failures,
                **({"skipped": self.skipped} if self.skipped else {}),
                **({"incomplete": self.incomplete} if self.incomplete else {})}


def _blanked_values(spec: Any, split: Split | None) -> list[str]:
    """The texts of the values no one but the environment's code may read."""
    if split is None or not isinstance(spec, dict):
        return []
    if split.sealed:
        values = list(spec.values())
    else:
        values = [spec[name] for name in split.hidden_fields or () if name in spec]
    texts: set[str] = set()
    todo = list(values)
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            todo += list(value.values())
        elif isinstance(value, list):
            todo += value
        elif value is not None and not isinstance(value, bool):
            texts.add(str(value))
            texts.add(json.dumps(value))
    return sorted((t for t in texts if len(t) >= MIN_BLANKED), key=len, reverse=True)


def _blank(text: str, values: list[str]) -> str:
    for value in values:
        text = text.replace(value, HIDDEN)
    return text


def _hint(field_name: str | None, spec: Any, split: Split | None) -> str:
    """"did you mean 'txt'?" for a KeyError on a row that has a close field (not for sealed rows,
    whose field names are theirs to keep)."""
    if not field_name or not isinstance(spec, dict) or (split is not None and split.sealed):
        return ""
    close = difflib.get_close_matches(field_name, [k for k in spec if isinstance(k, str)], n=1)
    return f"; the row has '{close[0]}'" if close else ""


def rows_check(*, version: EnvironmentVersion | None, split: Split | None,
               rows: list[tuple[int, int, bytes]]) -> RowCheck:
    """Run ``rows`` ((task index, line, task JSON)) through ``version`` in the sandbox."""
    if not rows:
        return RowCheck(sampled=0, failures=[])
    if version is None or version.status != EnvironmentVersion.Status.READY or not Path(version.package_path).is_dir():
        return RowCheck(sampled=0, failures=[], skipped="no version of the environment is served yet")
    specs = {row: orjson.loads(text) for row, _, text in rows}
    feed = orjson.dumps({"rows": [{"row": row, "line": line, "spec": specs[row]} for row, line, _ in rows]})
    timeout = settings.ORS_TASK_CHECK_TIMEOUT_SECONDS
    results = Results(max_bytes=settings.ORS_INSPECT_RESULT_BYTES)
    run = run_child(module="inspector", package_dir=Path(version.package_path), args=[version.entrypoint],
                    feed=feed, timeout=timeout, results=results)
    report = results.report() or {}
    failures = [f for f in report.get("failures") or [] if isinstance(f, dict) and f.get("row") in specs]
    lines = {row: line for row, line, _ in rows}
    incomplete = ""
    if report.get("ok") is not True:
        running = report.get("running")
        if run.refused or not run.exited:
            why = f"its process {run.refused}" if run.refused else f"it did not finish within {timeout:g} s"
            at = f" at row {running} (line {lines.get(running)})" if running in specs else ""
            incomplete = f"the check stopped{at}: {why}; the rows after it were not run"
        else:  # the environment itself could not be loaded: every row would fail
            failures.append({"row": None, "line": None, "field": None,
                             "error": str(report.get("error") or f"the check's process ended ({run.how()}) "
                                                                 "without a report")[:2000],
                             "traceback": str(report.get("traceback") or "")[-8000:]})
    shown = []
    for failure in failures:
        spec = specs.get(failure.get("row"))
        blanked = _blanked_values(spec, split)
        name = failure.get("field") if isinstance(failure.get("field"), str) else None
        shown.append({
            "row": failure.get("row"), "line": lines.get(failure.get("row")), "field": name,
            "error": _blank(str(failure.get("error", ""))[:2000], blanked) + _hint(name, spec, split),
            "traceback": _blank(str(failure.get("traceback", ""))[-8000:], blanked),
        })
    return RowCheck(sampled=len(rows), failures=shown, incomplete=incomplete)


def describe(failure: dict) -> str:
    """One line for a failing row: where, which field, what."""
    where = f"row {failure['row']}" if failure.get("row") is not None else "the check"
    if failure.get("line") is not None:
        where += f" (line {failure['line']})"
    field_name = f", field '{failure['field']}'" if failure.get("field") else ""
    return f"{where}{field_name}: {failure.get('error', '')}"
