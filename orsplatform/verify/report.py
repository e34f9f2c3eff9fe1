"""The verification report: reward agreement per task and overall, the episodes that changed (old
reward against new, the first call that differs), and the reference solutions' scores. Pure
functions over what replay.py returns."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orsplatform.verify.replay import Outcome, Replayed

# The report lists at most this many changed episodes (the counts cover them all).
MAX_CHANGED_LISTED = 200
REWARD_TOLERANCE = 1e-9


def _same_reward(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REWARD_TOLERANCE, abs_tol=REWARD_TOLERANCE)


def agree(old: Outcome, new: Outcome) -> bool:
    return old.kind == new.kind and old.finished == new.finished and _same_reward(old.reward, new.reward)


def total_reward(outcomes: Sequence[Outcome]) -> float | None:
    """Summed like a session's total_reward: rewards of successful calls; None when none had one."""
    rewards = [o.reward for o in outcomes if o.kind == "ok" and o.reward is not None]
    return sum(rewards) if rewards else None


def first_difference(replayed: Replayed) -> dict | None:
    """None when the replay scored every recorded call as recorded."""
    if replayed.setup_error is not None:
        return {"call": None, "name": "setup", "old": None, "new": {"error": replayed.setup_error}}
    for position, call in enumerate(replayed.episode.calls):
        new = replayed.outcomes[position] if position < len(replayed.outcomes) else Outcome("lost")
        if call.recorded is None or not agree(call.recorded, new):
            return {"call": position, "name": call.name,
                    "old": call.recorded.as_dict() if call.recorded else None, "new": new.as_dict()}
    return None


def _task_order(task: str) -> tuple:
    split, _, index = task.rpartition("/")
    return (split, int(index)) if index.isdigit() else (task, -1)


def episodes_report(replayed: Sequence[Replayed]) -> dict:
    tasks: dict[str, list[int]] = {}
    changed = []
    for item in replayed:
        difference = first_difference(item)
        counts = tasks.setdefault(item.episode.task, [0, 0])
        counts[0] += 1
        if difference is None:
            counts[1] += 1
            continue
        changed.append({
            "session": item.episode.key, "task": item.episode.task,
            "old_reward": total_reward([c.recorded for c in item.episode.calls if c.recorded is not None]),
            "new_reward": total_reward(item.outcomes), "first_difference": difference,
        })
    total = len(replayed)
    agreeing = total - len(changed)
    per_task = [{"task": task, "episodes": n, "agreeing": k, "agreement": k / n}
                for task, (n, k) in sorted(tasks.items(), key=lambda kv: _task_order(kv[0]))]
    return {
        "episodes": total, "agreeing": agreeing, "agreement": agreeing / total if total else None,
        "tasks": per_task, "changed_tasks": [t["task"] for t in per_task if t["agreeing"] < t["episodes"]],
        "changed": changed[:MAX_CHANGED_LISTED], "changed_count": len(changed),
    }


def solutions_report(replayed: Sequence[tuple[dict, Replayed | str]]) -> dict:
    """``replayed``: (the solution's line, split, index, expected reward) with its replay, or with
    the reason it could not run (a task that does not exist)."""
    results = []
    for solution, outcome in replayed:
        entry = dict(solution)
        if isinstance(outcome, str):
            entry.update(reward=None, passed=False, error=outcome)
        elif outcome.setup_error is not None:
            entry.update(reward=None, passed=False, error=f"setup failed: {outcome.setup_error}")
        else:
            reward = total_reward(outcome.outcomes)
            entry.update(reward=reward, passed=_same_reward(reward if reward is not None else 0.0,
                                                             solution["expected_reward"]), error="")
        results.append(entry)
    failed = [r for r in results if not r["passed"]]
    return {"total": len(results), "passed": len(results) - len(failed), "failed": len(failed), "results": results}
