"""What a package says about its verification: the manifest's ``[verify]`` table and the reference
solutions in ``verify/solutions.jsonl``. Checked at publish (a malformed one fails the publish
with the line that is wrong) and read again by the replay. Django-free but for settings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from orsplatform import bounded_json

SOLUTIONS_PATH = "verify/solutions.jsonl"


class VerifyConfigError(ValueError):
    """The package's verification settings or reference solutions are malformed."""


@dataclass(frozen=True)
class ManifestVerify:
    sample: int | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Solution:
    line: int
    split: str
    index: int
    calls: tuple[tuple[str, dict], ...]
    expected_reward: float


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def manifest_verify(manifest: dict) -> ManifestVerify:
    """The manifest's ``[verify]`` table: ``sample`` (episodes replayed, 0 for none) and
    ``threshold`` (agreement in [0, 1] below which the version waits; absent: report only)."""
    table = manifest.get("verify", {})
    if not isinstance(table, dict):
        raise VerifyConfigError("manifest.toml: [verify] must be a table.")
    sample, threshold = table.get("sample"), table.get("threshold")
    limit = settings.ORS_REPLAY_MAX_SAMPLE
    if sample is not None and (not isinstance(sample, int) or isinstance(sample, bool) or not 0 <= sample <= limit):
        raise VerifyConfigError(f"manifest.toml: [verify] sample must be a whole number in [0, {limit}].")
    if threshold is not None and (not _number(threshold) or not 0 <= threshold <= 1):
        raise VerifyConfigError("manifest.toml: [verify] threshold must be a number in [0, 1] (an agreement).")
    return ManifestVerify(sample=sample, threshold=None if threshold is None else float(threshold))


def _solution(line: int, raw: object) -> Solution:
    def bad(what: str) -> VerifyConfigError:
        return VerifyConfigError(f"{SOLUTIONS_PATH} line {line}: {what}")

    if not isinstance(raw, dict):
        raise bad("each line must be a JSON object with split, index, calls and expected_reward.")
    split, index, calls, expected = raw.get("split"), raw.get("index"), raw.get("calls"), raw.get("expected_reward")
    if not isinstance(split, str) or not split:
        raise bad("'split' must be a split's name.")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise bad("'index' must be a task index (a whole number >= 0).")
    if not isinstance(calls, list) or not calls:
        raise bad("'calls' must be a non-empty list of {\"name\": ..., \"input\": {...}}.")
    parsed = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise bad(f"call {position} needs a tool 'name'.")
        tool_input = call.get("input", {})
        if not isinstance(tool_input, dict):
            raise bad(f"call {position}: 'input' must be an object.")
        parsed.append((call["name"], tool_input))
    if not _number(expected):
        raise bad("'expected_reward' must be a number (the episode's total reward).")
    return Solution(line=line, split=split, index=index, calls=tuple(parsed), expected_reward=float(expected))


def read_solutions(package_dir: Path) -> list[Solution]:
    """The package's reference solutions ([] without the file). Read from the stored package, which
    tenant code never writes (validation runs on a copy); a link is refused all the same."""
    path = Path(package_dir) / SOLUTIONS_PATH
    if path.is_symlink():
        raise VerifyConfigError(f"{SOLUTIONS_PATH} must be a plain file, not a link.")
    if not path.is_file():
        return []
    limit = settings.ORS_REPLAY_MAX_SOLUTIONS_BYTES
    if path.stat().st_size > limit:
        raise VerifyConfigError(f"{SOLUTIONS_PATH} is larger than {limit} bytes.")
    solutions = []
    for number, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            raw = bounded_json.loads(text, lone_surrogates=True)
        except ValueError as exc:
            raise VerifyConfigError(f"{SOLUTIONS_PATH} line {number}: not JSON ({exc}).") from None
        solutions.append(_solution(number, raw))
        if len(solutions) > settings.ORS_REPLAY_MAX_SOLUTIONS:
            raise VerifyConfigError(f"{SOLUTIONS_PATH}: more than {settings.ORS_REPLAY_MAX_SOLUTIONS} solutions.")
    return solutions


def package_verify_check(package_dir: Path, manifest: dict) -> None:
    """Publish-time check of both (VerifyConfigError says what is wrong)."""
    manifest_verify(manifest)
    read_solutions(package_dir)
