"""Logs two training runs with the unmodified `openreward` client, as a trainer would: run in its
own process (the client keeps a background sender and an atexit hook) with OPENREWARD_API_URL
pointing at a live platform server and OPENREWARD_API_KEY a platform key.

Run "grpo-fast" learns quickly, "grpo-slow" slowly: at step s, rollout j of the step's group of
four scores min(1, rate * s + 0.05 * j). Usage: python log_two_runs.py STEPS"""

from __future__ import annotations

import sys

from openreward import OpenReward
from openreward.models import RolloutInfo, RunInfo

RATES = {"grpo-fast": 0.2, "grpo-slow": 0.07}
GROUP = 4


def reward(run: str, step: int, j: int) -> float:
    return round(min(1.0, RATES[run] * step + 0.05 * j), 6)


def main(steps: int) -> None:
    client = OpenReward(run_info=RunInfo(model_name="tiny-gpt2", rl_algorithm="grpo", batch_size=GROUP))
    for run in RATES:
        for step in range(steps):
            for j in range(GROUP):
                rollout = client.rollout.create(run_name=run, environment="builtin/math", split="test",
                                                task_spec={"index": j})
                info = RolloutInfo(task_index=j, current_step=step)
                rollout.log_openai_completions({"role": "system", "content": "Answer with a number."},
                                               rollout_info=info)
                rollout.log_openai_completions({"role": "user", "content": f"What is {step} + {j}?"},
                                               rollout_info=info)
                rollout.log_openai_completions({"role": "assistant", "content": str(step + j)},
                                               reward=reward(run, step, j), is_finished=True, rollout_info=info)
    client.rollout.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
