"""Evaluation runs end to end: the platform drives the reference AAP agent (a real HTTP/SSE server
in its own process) over the bundled math tasks through the episode gateway."""

from __future__ import annotations

import logging

import pytest

from orsplatform.episodes.models import Session, ToolCall
from orsplatform.evals.models import EvalEpisode
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import AGENT_KEY, api, launch, register, wait_run


@pytest.mark.parametrize("stream", ["none", "message", "delta"])
def test_per_task_rewards_equal_the_known_outcomes_in_every_stream_mode(owner, agents, stream):
    agent = register(owner, agents, "solver", stream)
    run = launch(owner, agent["id"], start=0, stop=12, concurrency=4)
    assert run["status"] in ("queued", "running") and run["total"] == 12
    run = wait_run(owner, run["id"])
    assert run["status"] == "finished", run
    expected = {i: expected_reward("test", i) for i in range(12)}
    assert {e["task_index"]: e["reward"] for e in run["episodes"]} == expected
    assert 0 < sum(expected.values()) < 12  # the agent passes some and fails others on purpose
    assert run["done"] == 12 and run["passed"] == sum(expected.values())
    assert run["mean_reward"] == pytest.approx(sum(expected.values()) / 12)
    low, high = run["mean_reward_interval"]  # the mean reward's 95 % interval
    assert 0.0 <= low <= run["mean_reward"] <= high <= 1.0 and low < high, run["mean_reward_interval"]
    lo, hi = run["pass_rate_interval"]
    assert lo < run["pass_rate"] < hi
    assert all(e["stop_reason"] == "finished" and e["finished"] and e["error"] is None for e in run["episodes"])
    assert run["input_tokens"] > 0 and run["output_tokens"] == 7 * 12 and run["turns"] == 12
    # Recorded like any session: one AAP-protocol episode per task, its submit in the audit log.
    sessions = Session.objects.filter(sid__in=[e["sid"] for e in run["episodes"]])
    assert sessions.count() == 12
    assert set(sessions.values_list("protocol", "status").distinct()) == {("aap", "deleted")}
    # (Per session, not a total: on SQLite a late write of an earlier test's gateway may land on a
    # reused row id.)
    assert ToolCall.objects.filter(session__in=sessions, name="submit").values("session").distinct().count() == 12
    # Every agent session was deleted, every ORS episode ended.
    stats = agents.stats()
    assert stats["created"] == stats["deleted"] == 12 and stats["open"] == 0
    # The agent's text and tool calls are kept with the episode.
    transcript = EvalEpisode.objects.get(run_id=run["id"], task_index=0).transcript
    kinds = [t["kind"] for t in transcript]
    assert kinds == ["assistant", "tool"]
    assert any(b["type"] == "text" and b["text"].startswith("My answer is") for b in transcript[0]["blocks"])
    assert transcript[1]["name"] == "submit" and transcript[1]["reward"] == 1.0


def test_the_agent_key_is_sent_as_a_bearer_token_and_never_shown(owner, agents, caplog):
    # Everything this process logs, at DEBUG: the API requests, the engine that drives the run here
    # (eager Celery, on its own thread) and its HTTP client's requests to the agent.
    for name in (None, "orsplatform", "django", "httpx", "httpcore", "celery"):
        caplog.set_level(logging.DEBUG, logger=name)
    agent = register(owner, agents, "solver", "message")
    assert "api_key" not in agent and agent["has_api_key"] is True
    listed = api(owner).get("/api/v1/agents").json()["agents"]
    assert "agent-secret-key" not in str(listed)
    assert listed[0]["capabilities"]["stream"] == {"delta": {}, "message": {}, "none": {}}
    run = wait_run(owner, launch(owner, agent["id"], stop=2)["id"])
    assert run["status"] == "finished" and run["done"] == 2
    assert "Bearer agent-secret-key-5f2b" in agents.stats()["auth"]
    # The capture saw the run's traffic to the agent, and the key in none of it.
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    assert f"{agents.url}/session" in logged
    assert AGENT_KEY not in logged and "agent-secret-key" not in caplog.text


# `told`: how many of the run's 3 agent sessions the agent gave the platform an id for (in
# session_start, or in the reply of PUT /session): each of those must be deleted, whatever went wrong
# after. An agent that fails before telling an id leaves the platform nothing to delete.
@pytest.mark.parametrize(("agent_name", "stream", "stop_reason", "error", "told"), [
    ("http500", "none", "error", "Agent answered HTTP 500: the agent exploded", 0),
    ("http500", "delta", "error", "Agent answered HTTP 500: the agent exploded", 0),
    ("http429", "none", "error", "Agent answered HTTP 429: too many sessions", 0),
    ("http429", "message", "error", "Agent answered HTTP 429: too many sessions", 0),
    ("http400", "none", "error", "Agent answered HTTP 400: the agent refused the tool results", 3),
    ("http400", "delta", "error", "Agent answered HTTP 400: the agent refused the tool results", 3),
    ("malformed", "none", "error", "Malformed reply: not JSON", 0),
    ("malformed", "message", "error", "Malformed SSE: 'text' data is not JSON", 3),
    ("confused", "none", "error", "Malformed reply: unknown stopReason 'pondering'", 3),
    ("confused", "delta", "error", "Malformed reply: unknown stopReason 'pondering'", 3),
    ("truncated", "delta", "error", "Agent fault: the agent's event stream ended without its final event", 3),
    ("truncated", "none", "error", "Malformed reply: not JSON", 0),
    ("endless", "delta", "error", "Agent timed out: the turn did not end within 1.5 s", 3),
    ("endless", "none", "error", "Agent timed out", 0),
    ("slow", "message", "error", "Agent timed out", 0),
    ("looper", "message", "max_turns", "The agent did not finish the episode within 3 turns.", 3),
    ("silent", "none", "end_turn", None, 3),
])
def test_a_misbehaving_agent_scores_failed_with_its_reason_and_the_run_goes_on(
        owner, agents, agent_name, stream, stop_reason, error, told):
    agent = register(owner, agents, agent_name, stream)
    run = wait_run(owner, launch(owner, agent["id"], stop=3, max_turns=3, turn_timeout=1.5)["id"])
    assert run["status"] == "finished" and run["done"] == 3 and run["passed"] == 0, run
    for episode in run["episodes"]:
        assert episode["stop_reason"] == stop_reason and episode["reward"] == 0.0
        assert (episode["error"] or None) == error if error is None else episode["error"].startswith(error), episode
    assert Session.objects.filter(sid__in=[e["sid"] for e in run["episodes"]]).exclude(status="deleted").count() == 0
    # Every agent session whose id the platform learnt was deleted (an episode is scored only after
    # its clean-up, so the finished run has sent them all). One that failed before telling its id
    # stays open on the agent's server: the platform cannot name it.
    stats = agents.stats()
    assert stats["told"] == told and stats["deleted"] == told, stats
    assert stats["open"] == stats["created"] - told, stats
    if agent_name == "http429":
        assert stats["created"] == 0 and stats["open"] == 0  # it refused PUT /session before creating one
    if told:
        assert stats["created"] == stats["deleted"] == 3 and stats["open"] == 0, stats
    if agent_name == "http400":
        assert stats["posts"] == 3  # the failure came on the POST with the tool results, after a session existed


@pytest.mark.parametrize("stream", ["none", "delta"])
def test_several_tool_results_go_back_to_the_agent_in_one_post(owner, agents, stream):
    # `juggler`'s first turn calls two tools the math environment does not have and a submit the
    # environment refuses (no answer): none ends the episode; its second turn submits the answer.
    agent = register(owner, agents, "juggler", stream)
    run = wait_run(owner, launch(owner, agent["id"], stop=2, max_turns=3)["id"])
    assert run["status"] == "finished" and run["done"] == 2 and run["passed"] == 2 and run["errors"] == 0, run
    assert all(e["reward"] == 1.0 and e["stop_reason"] == "finished" and e["turns"] == 2 and e["tool_calls"] == 2
               for e in run["episodes"]), run["episodes"]
    stats = agents.stats()
    assert stats["posts"] == 2, stats  # one POST per episode carried every result of the first turn
    # The calls of each episode's first turn, as the platform recorded them.
    first_calls = []
    for episode in EvalEpisode.objects.filter(run_id=run["id"]).order_by("task_index"):
        kinds = [t["kind"] for t in episode.transcript]
        assert kinds == ["assistant", "tool", "tool", "tool", "assistant", "tool"], kinds
        uses = [b for b in episode.transcript[0]["blocks"] if b["type"] == "tool_use"]
        assert [u["name"] for u in uses] == ["scratchpad", "calculator", "submit"]
        first_calls.append(tuple(u["toolCallId"] for u in uses))
        assert episode.transcript[-1]["name"] == "submit" and episode.transcript[-1]["reward"] == 1.0
    posted = []
    for post in stats["post_messages"]:
        messages = post["messages"]
        assert [m["role"] for m in messages] == ["tool", "tool", "tool"], messages
        unknown_a, unknown_b, refused = (m["content"] for m in messages)
        assert unknown_a == "Error: unknown tool 'scratchpad'." and unknown_b == "Error: unknown tool 'calculator'."
        assert isinstance(refused, str) and refused.startswith("Error:"), refused  # the environment's refusal
        posted.append(tuple(m["toolCallId"] for m in messages))
    assert sorted(posted) == sorted(first_calls)  # each call answered, in the order the agent made them


def test_an_untrusted_server_side_tool_is_denied_in_one_turn_with_the_results(owner, agents):
    # `asker`'s first turn calls its untrusted server-side `web_search` and the environment's
    # `submit` without an answer (refused, so the episode goes on); its second turn answers.
    agent = register(owner, agents, "asker", "message")
    run = wait_run(owner, launch(owner, agent["id"], stop=2)["id"])
    assert run["status"] == "finished" and run["passed"] == 2
    stats = agents.stats()
    permissions = stats["permissions"]
    assert len(permissions) == 2 and all(p["granted"] is False and p["reason"] for p in permissions)
    # One POST per episode carried both the denial and the tool result.
    assert stats["posts"] == 2 and len(stats["post_messages"]) == 2, stats
    first_calls = []
    for episode in EvalEpisode.objects.filter(run_id=run["id"]).order_by("task_index"):
        assert [t["kind"] for t in episode.transcript] == ["assistant", "permission", "tool", "assistant", "tool"]
        uses = [b for b in episode.transcript[0]["blocks"] if b["type"] == "tool_use"]
        assert [u["name"] for u in uses] == ["web_search", "submit"]
        first_calls.append((uses[0]["toolCallId"], uses[1]["toolCallId"]))
    posted = []
    for post in stats["post_messages"]:
        denial, result = post["messages"]
        assert denial["role"] == "tool_permission" and denial["granted"] is False and denial["reason"], denial
        assert result["role"] == "tool" and result["content"].startswith("Error:"), result
        posted.append((denial["toolCallId"], result["toolCallId"]))
    assert sorted(posted) == sorted(first_calls)


def test_a_run_never_exceeds_its_concurrency(owner, agents):
    agent = register(owner, agents, "solver", "delta")
    run = wait_run(owner, launch(owner, agent["id"], stop=24, concurrency=3)["id"])
    assert run["status"] == "finished" and run["done"] == 24
    assert agents.stats()["max_open"] <= 3


def test_the_teams_open_session_limit_applies_and_the_run_waits_for_slots(owner, agents):
    owner.team.max_open_sessions = 2
    owner.team.save()
    agent = register(owner, agents, "solver", "none")
    run = wait_run(owner, launch(owner, agent["id"], stop=16, concurrency=8)["id"])
    assert run["status"] == "finished" and run["done"] == 16 and run["errors"] == 0, run
    assert agents.stats()["max_open"] <= 2


def test_secrets_reach_the_environment_and_are_stored_nowhere(owner, agents):
    from orsplatform.evals.models import EvalRun

    agent = register(owner, agents, "solver", "message")
    run = wait_run(owner, launch(owner, agent["id"], stop=2, secrets={"TOKEN": "s3cr3t-value-1234"})["id"])
    assert run["status"] == "finished"
    calls = ToolCall.objects.filter(session__sid__in=[e["sid"] for e in run["episodes"]])
    assert [c.output["output"]["metadata"]["secrets_seen"] for c in calls] == [["TOKEN"], ["TOKEN"]]
    stored = (str(list(EvalRun.objects.filter(id=run["id"]).values())) + str(list(calls.values()))
              + str(list(EvalEpisode.objects.filter(run_id=run["id"]).values())))
    assert "s3cr3t-value-1234" not in stored
    assert EvalRun.objects.get(id=run["id"]).secret_names == ["TOKEN"]  # names only


def test_a_run_with_secrets_resumes_only_when_given_them_again(owner, agents):
    agent = register(owner, agents, "solver", "none")
    # Long enough that the cancel lands while it runs, even on a fast machine.
    run = launch(owner, agent["id"], stop=120, concurrency=2, secrets={"TOKEN": "s3cr3t-value-5678"})
    wait_run(owner, run["id"], until=lambda r: r["done"] >= 2)
    assert api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel").status_code == 200
    wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)
    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", {}, format="json")
    assert r.status_code == 400 and "TOKEN" in r.json()["detail"] and "s3cr3t" not in r.content.decode()
    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", {"secrets": {"TOKEN": "s3cr3t-value-5678"}},
                        format="json")
    assert r.status_code == 200, r.content
    done = wait_run(owner, run["id"])
    assert done["status"] == "finished" and done["done"] == 120 and done["errors"] == 0, done
    calls = ToolCall.objects.filter(session__sid__in=[e["sid"] for e in done["episodes"]])
    assert calls.count() == 120 and all(c.output["output"]["metadata"]["secrets_seen"] == ["TOKEN"] for c in calls)


def test_sealed_secrets_open_only_for_their_run(settings):
    from orsplatform.evals import crypto

    sealed = crypto.seal_run_secrets(7, {"TOKEN": "s3cr3t-value-9"})
    assert "s3cr3t" not in sealed and crypto.open_run_secrets(7, sealed) == {"TOKEN": "s3cr3t-value-9"}
    with pytest.raises(ValueError, match="another run"):
        crypto.open_run_secrets(8, sealed)
    settings.ORS_AGENT_KEY_SECRET = "rotated"
    with pytest.raises(ValueError, match="do not open"):
        crypto.open_run_secrets(7, sealed)
