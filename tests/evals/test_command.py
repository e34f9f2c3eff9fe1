"""manage.py eval_run launches, shows progress and resumes from a shell."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from orsplatform.evals.models import EvalRun
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import register


def test_it_launches_a_run_and_waits_with_a_progress_bar(owner, agents):
    register(owner, agents, "solver", "delta")
    out = io.StringIO()
    call_command("eval_run", team=owner.team.slug, agent="solver-delta", environment="builtin/math", split="test",
                 stop=8, concurrency=4, stdout=out)
    run = EvalRun.objects.get(team=owner.team)
    assert run.status == "finished"
    text = out.getvalue()
    assert f"Run #{run.id}: 8 episodes" in text and "[##############################] 8/8" in text
    passed = sum(expected_reward("test", i) for i in range(8))
    assert f"passed {int(passed)} errors 0" in text and "pass rate" in text
    out = io.StringIO()
    call_command("eval_run", team=owner.team.slug, resume=run.id, stdout=out)  # nothing left to run
    assert "8/8" in out.getvalue()


def test_it_explains_what_is_wrong(owner, agents):
    with pytest.raises(CommandError, match="No agent 'ghost'"):
        call_command("eval_run", team=owner.team.slug, agent="ghost", environment="builtin/math", stdout=io.StringIO())
    register(owner, agents, "solver", "none")
    with pytest.raises(CommandError, match="has no split 'nope'"):
        call_command("eval_run", team=owner.team.slug, agent="solver-none", environment="builtin/math", split="nope",
                     stdout=io.StringIO())
