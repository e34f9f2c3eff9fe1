"""Refusals that name the fix: the one wording of each error a trainer meets on every face (ORS,
OpenEnv over HTTP and WebSocket, MCP), so a script that guessed a split, an index, a tool or an
environment name learns the right one from the answer instead of from the docs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from orsplatform.catalog.selectors import EnvHandle, SplitInfo
from orsplatform.engine.errors import GatewayError

# Long lists are cut: the answer stays one readable line whatever the environment declares.
MAX_LISTED = 20


def listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" (and {len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else "")


def unknown_split(env: EnvHandle, name: Any) -> GatewayError:
    if not env.split_order:
        return GatewayError(400, f"Invalid split {name!r}: {env.full_name} has no splits.")
    return GatewayError(400, f"Invalid split {name!r}; the splits of {env.full_name} are: {listed(env.split_order)}.")


def split_named(env: EnvHandle, name: Any) -> SplitInfo:
    """The split `name`, or 400 listing the valid ones."""
    split = env.splits.get(name) if isinstance(name, str) else None
    if split is None:
        raise unknown_split(env, name)
    return split


def index_out_of_range(split: SplitInfo, index: int) -> GatewayError:
    if split.num_tasks == 0:
        return GatewayError(400, f"Invalid index {index}: split {split.name!r} has no tasks.")
    return GatewayError(400, f"Invalid index {index}: split {split.name!r} has {split.num_tasks} tasks, "
                             f"indices 0 to {split.num_tasks - 1}.")


def unknown_tool(name: str, tools: Iterable[str]) -> str:
    """The error of a call to a tool the episode does not have (keeps the SDKs' "is not a valid
    tool" wording, which clients match on)."""
    names = list(dict.fromkeys(tools))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6) if len(name) <= 100 else []
    name = name if len(name) <= 100 else name[:100] + "…"  # the agent's text, echoed: bounded
    if not names:
        return f"{name!r} is not a valid tool: this episode has no tools."
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{name!r} is not a valid tool; the tools are: {listed(names)}.{hint}"


def closest_name(ref: str, names: Iterable[str]) -> str | None:
    """The visible environment name closest to `ref`, or None when nothing is close. Slugs are
    compared (a shared team prefix alone makes no name close), and among equally close slugs the
    team closest to the one written wins."""
    if len(ref) > 200:
        return None
    team, _, slug = ref.partition("@")[0].rpartition("/")
    by_slug: dict[str, list[str]] = {}
    for name in names:
        by_slug.setdefault(name.rpartition("/")[2], []).append(name)
    best = difflib.get_close_matches(slug.lower(), list(by_slug), n=1, cutoff=0.6)
    if not best:
        return None
    team = team.lower()
    return max(by_slug[best[0]],
               key=lambda name: difflib.SequenceMatcher(None, team, name.rpartition("/")[0].lower()).ratio())


def unknown_environment(ref: str, suggestion: str | None, *, deployment: bool = False) -> GatewayError:
    hint = f"Did you mean {suggestion!r}?" if suggestion else "No environment this key may use has a similar name."
    shown = ref if len(ref) <= 200 else ref[:200] + "…"
    if deployment:  # the X-Deployment header's wording, which clients match on
        return GatewayError(404, f"Deployment not found: {shown!r}. {hint}")
    return GatewayError(404, f"Environment {shown!r} not found. {hint}")
