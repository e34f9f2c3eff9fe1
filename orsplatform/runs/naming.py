"""How an episode gets its run's name (shared by the ORS and OpenEnv faces and the Rollout API)."""

from __future__ import annotations

from typing import Any

RUN_NAME_MAX = 200
RUN_HEADER = "x-run"


class BadRunName(ValueError):
    """A run name that is not a short printable string (the faces answer 400)."""


def run_name_clean(value: Any) -> str | None:
    """A client's run name, stripped; None when it named none. Raises BadRunName."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRunName("'run' must be a string")
    name = value.strip()
    if len(name) > RUN_NAME_MAX:
        raise BadRunName(f"A run name is at most {RUN_NAME_MAX} characters")
    if any(not ch.isprintable() for ch in name):
        raise BadRunName("A run name may not contain control characters")
    return name or None


def run_name_for(caller: Any, run: str | None) -> str:
    """The run an episode belongs to: the one its client named, else its API key's name ("" for
    an anonymous caller)."""
    return (run or getattr(caller, "api_key_name", "") or "")[:RUN_NAME_MAX]
