"""Evaluation writes: agents, runs and their episodes. The run itself is driven by evals/engine.py on
a Celery worker; these functions are what it (and the API, pages and command) call to change rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from orsplatform.catalog.selectors import environment_resolve
from orsplatform.celery import task
from orsplatform.evals import aap, crypto
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from orsplatform.teams.auth import Caller
from orsplatform.teams.models import Team


def team_caller(*, team: Team) -> Caller:
    """The caller a run's episodes run as: the team itself, with its limits, without an API key."""
    return Caller(team_id=team.id, team_slug=team.slug, scopes=frozenset({"sessions"}),
                  max_open_sessions=team.max_open_sessions,
                  max_tool_calls_per_second=team.max_tool_calls_per_second)


# --- agents ------------------------------------------------------------------------------------------

def agent_register(*, team: Team, name: str, url: str, agent: str, api_key: str = "", options: dict | None = None,
                   stream: str = "none", trusted_tools: list[str] | None = None) -> Agent:
    """Register an agent after reading its /meta (AAP version 1 to 3, the named agent, the stream mode).
    Raises ValidationError with the reason (unreachable, wrong version, unsupported mode, SSRF)."""
    if stream not in aap.STREAM_MODES:
        raise ValidationError(f"stream must be one of {', '.join(aap.STREAM_MODES)}.")
    try:
        meta = aap.fetch_meta(url, api_key, agent)
    except aap.AapError as exc:
        raise ValidationError(str(exc)) from None
    if "tools" not in ((meta.get("capabilities") or {}).get("application") or {}):
        raise ValidationError("The agent does not accept application-side tools (capabilities.application.tools); "
                              "an evaluation gives it the environment's tools that way.")
    modes = aap.stream_modes(meta)
    if stream not in modes:
        raise ValidationError(f"The agent does not support stream {stream!r} (it supports: {', '.join(modes)}).")
    server_tools = {t.get("name") for t in meta.get("tools") or [] if isinstance(t, dict)}
    unknown = sorted(set(trusted_tools or []) - server_tools)
    if unknown:
        raise ValidationError(f"trusted_tools names tools the agent does not declare: {', '.join(unknown)}.")
    try:
        return Agent.objects.create(team=team, name=name, url=url, agent=agent, options=options or {}, stream=stream,
                                    trusted_tools=list(trusted_tools or []), api_key_encrypted=crypto.encrypt(api_key),
                                    meta=meta)
    except IntegrityError:
        raise ValidationError(f"The team already has an agent named {name!r}.") from None


def agent_ping(*, agent: Agent) -> dict[str, Any]:
    """Read the agent's /meta again and keep what it says now. Raises ValidationError."""
    try:
        meta = aap.fetch_meta(agent.url, crypto.decrypt(agent.api_key_encrypted), agent.agent)
    except (aap.AapError, ValueError) as exc:
        raise ValidationError(str(exc)) from None
    agent.meta = meta
    agent.save(update_fields=["meta"])
    return meta


def agent_remove(*, agent: Agent) -> None:
    """Soft delete: the key is wiped at once; runs and leaderboards keep the agent's name."""
    agent.deleted_at = timezone.now()
    agent.api_key_encrypted = ""
    agent.save(update_fields=["deleted_at", "api_key_encrypted"])
    EvalRun.objects.filter(agent=agent, status__in=(EvalRun.Status.QUEUED, EvalRun.Status.RUNNING)).update(
        status=EvalRun.Status.CANCELLED, finished_at=timezone.now())


# --- runs --------------------------------------------------------------------------------------------

def _lease_end(now: datetime | None = None) -> datetime:
    """When a lease taken now ends: a driving worker's (renewed while it lives), or a queued run's
    message's (until then a worker is expected to claim it and a second resume is refused as a
    double click; after it the message may be lost, and a resume sends another, harmless since only
    one worker at a time can claim a run)."""
    return (now or timezone.now()) + timedelta(seconds=settings.ORS_EVAL_LEASE_SECONDS)


def _enqueue(run_id: int, secrets: dict[str, str] | None) -> None:
    # The secrets ride in the message, sealed to this run: the broker holds ciphertext, the
    # database only their names, and a redelivered message (a worker died) still carries them.
    sealed = crypto.seal_run_secrets(run_id, secrets)
    transaction.on_commit(lambda: task("evals.run_eval").delay(run_id, sealed))


def eval_run_launch(*, team: Team, agent: Agent, environment: str, split: str, start: int = 0,
                    stop: int | None = None, concurrency: int = 4, max_turns: int = 20,
                    secrets: dict[str, str] | None = None, pass_threshold: float = 1.0,
                    turn_timeout: float | None = None, enqueue: bool = True) -> EvalRun:
    """Pin the environment version the caller may use, check the task range, create the run and
    its episode rows, and enqueue it. Raises ValidationError."""
    if agent.team_id != team.id or agent.deleted_at is not None:
        raise ValidationError("No such agent.")
    env = environment_resolve(caller=team_caller(team=team), ref=environment)
    if env is None:
        raise ValidationError(f"Environment {environment!r} not found.")
    info = env.splits.get(split)
    if info is None:
        raise ValidationError(f"Environment {env.full_name} has no split {split!r} "
                              f"(it has: {', '.join(env.split_order)}).")
    stop = info.num_tasks if stop is None else stop
    if not 0 <= start < stop <= info.num_tasks:
        raise ValidationError(f"start and stop must satisfy 0 <= start < stop <= {info.num_tasks}.")
    if stop - start > settings.ORS_EVAL_MAX_EPISODES:
        raise ValidationError(f"A run has at most {settings.ORS_EVAL_MAX_EPISODES} episodes.")
    if not 1 <= concurrency <= settings.ORS_EVAL_MAX_CONCURRENCY:
        raise ValidationError(f"concurrency must be between 1 and {settings.ORS_EVAL_MAX_CONCURRENCY}.")
    if not 1 <= max_turns <= 1000:
        raise ValidationError("max_turns must be between 1 and 1000.")
    if turn_timeout is not None and not 0 < turn_timeout <= settings.ORS_EVAL_TURN_TIMEOUT_SECONDS:
        raise ValidationError(f"turn_timeout must be in (0, {settings.ORS_EVAL_TURN_TIMEOUT_SECONDS:g}].")
    _check_secrets(secrets)
    with transaction.atomic():
        run = EvalRun.objects.create(
            team=team, agent=agent, environment_id=env.environment_id, version_id=env.version_id, split=split, start=start, stop=stop,
            concurrency=concurrency, max_turns=max_turns, pass_threshold=pass_threshold, turn_timeout=turn_timeout,
            secret_names=sorted(secrets or {}), lease_until=_lease_end() if enqueue else None)
        EvalEpisode.objects.bulk_create([EvalEpisode(run=run, task_index=i) for i in range(start, stop)],
                                        batch_size=2000)
        if enqueue:
            _enqueue(run.id, secrets)
    return run


def _check_secrets(secrets: Any) -> None:
    if secrets is not None and not (isinstance(secrets, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in secrets.items())):
        raise ValidationError("secrets must be an object of strings.")


def eval_run_cancel(*, run: EvalRun) -> EvalRun:
    """Stop a queued or running run. Its worker sees the status within a second, stops starting
    episodes, and ends the open ones (scored ones stay; the others go back to pending)."""
    updated = EvalRun.objects.filter(id=run.id, status__in=(EvalRun.Status.QUEUED, EvalRun.Status.RUNNING)).update(
        status=EvalRun.Status.CANCELLED, finished_at=timezone.now())
    if not updated:
        raise ValidationError(f"The run is {run.status}; only queued or running runs can be cancelled.")
    run.refresh_from_db()
    return run


def _lease_lapsed(run: EvalRun) -> bool:
    return run.lease_until is None or run.lease_until < timezone.now()


def eval_run_resume(*, run: EvalRun, secrets: dict[str, str] | None = None, enqueue: bool = True) -> EvalRun:
    """Run again only the episodes not yet scored. Allowed for a cancelled, failed or finished run,
    for a running one whose worker died (its lease lapsed), and for a queued one that no worker took
    within a lease (its message may be lost: a second message is harmless, since only one worker at
    a time can claim the run; within the lease, a second resume is a double click and refused). The
    platform does not keep a run's secrets, so a run launched with some needs them again."""
    _check_secrets(secrets)
    if run.agent.deleted_at is not None:
        raise ValidationError("The run's agent was removed.")
    if run.status == EvalRun.Status.RUNNING and not _lease_lapsed(run):
        raise ValidationError(f"The run is {run.status}; it will go on by itself.")
    if run.status == EvalRun.Status.QUEUED and not _lease_lapsed(run):
        raise ValidationError("The run is queued; it starts as soon as a worker takes it.")
    if secrets is None and run.secret_names:
        raise ValidationError(f"The run was launched with secrets ({', '.join(run.secret_names)}); the platform does "
                              "not keep them, so give them again to resume it.")
    with transaction.atomic():
        fields = {"status": EvalRun.Status.QUEUED, "finished_at": None, "error": "", "lease_owner": "",
                  "lease_until": _lease_end() if enqueue else None}
        if secrets is not None:
            fields["secret_names"] = sorted(secrets)
        # Conditional on what was checked above: a worker that claimed the run meanwhile keeps it.
        # A queued run is resumed once per lapsed message lease (two resumes at once: one wins).
        claimable = ~Q(status__in=(EvalRun.Status.RUNNING, EvalRun.Status.QUEUED)) | Q(lease_until__isnull=True) | Q(
            lease_until__lt=timezone.now())
        if not EvalRun.objects.filter(claimable, id=run.id).update(**fields):
            raise ValidationError(f"The run is {run.status}; it will go on by itself.")
        if run.status != EvalRun.Status.QUEUED:
            # A dead worker's open episodes: not scored, so run again. (A queued run has none, and
            # its worker may be claiming it right now.)
            EvalEpisode.objects.filter(run=run, status=EvalEpisode.Status.RUNNING).update(
                status=EvalEpisode.Status.PENDING)
        if enqueue:
            _enqueue(run.id, secrets)
    run.refresh_from_db()
    return run


def eval_runs_resume_orphaned(*, limit: int = 100) -> tuple[int, int]:
    """Runs whose driving worker died: running, with a lease lapsed for a whole lease more (a live
    worker renews it every few seconds). Without secrets they are resumed (only their unscored
    episodes run again); with secrets they fail with the reason, since the platform does not keep
    secrets and only the team can give them again. Returns (resumed, failed)."""
    cutoff = timezone.now() - timedelta(seconds=settings.ORS_EVAL_LEASE_SECONDS)
    resumed = failed = 0
    for run in (EvalRun.objects.select_related("agent").filter(status=EvalRun.Status.RUNNING, lease_until__lt=cutoff)
                .order_by("lease_until")[:limit]):
        if run.secret_names or run.agent.deleted_at is not None:
            reason = ("Its worker was lost, and the platform does not keep a run's secrets: resume it with them."
                      if run.secret_names else "Its worker was lost, and its agent was removed.")
            failed += EvalRun.objects.filter(id=run.id, status=EvalRun.Status.RUNNING, lease_until__lt=cutoff).update(
                status=EvalRun.Status.FAILED, error=reason, finished_at=timezone.now(), lease_until=None)
            continue
        try:
            eval_run_resume(run=run)
        except ValidationError:
            continue  # a worker took it meanwhile
        resumed += 1
    return resumed, failed


# --- what the driving worker writes -----------------------------------------------------------------

@dataclass
class RunPlan:
    """Everything the engine needs to drive a run, read once when it claims it."""

    run_id: int
    caller: Caller
    env_ref: str
    version_id: int
    split: str
    indices: list[int]
    concurrency: int
    max_turns: int
    pass_threshold: float
    turn_timeout: float
    agent_url: str
    agent_name: str
    agent_options: dict
    agent_stream: str
    agent_tools: list[dict]
    # The AAP version the agent's /meta declared at registration (or its last ping).
    agent_protocol: int
    secret_names: list[str]
    api_key: str = field(repr=False, default="")
    secrets: dict[str, str] = field(repr=False, default_factory=dict)


def eval_run_claim(*, run_id: int, owner: str) -> RunPlan | None:
    """Take the run for this worker (None: it ended, or a live worker drives it)."""
    now = timezone.now()
    lease = _lease_end(now)
    claimable = Q(status=EvalRun.Status.QUEUED) | Q(status=EvalRun.Status.RUNNING) & (
        Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner))
    if not EvalRun.objects.filter(claimable, id=run_id).update(
            status=EvalRun.Status.RUNNING, lease_owner=owner, lease_until=lease):
        return None
    run = EvalRun.objects.select_related("team", "agent", "environment__team", "version").get(id=run_id)
    if run.started_at is None:
        EvalRun.objects.filter(id=run_id).update(started_at=now)
    EvalEpisode.objects.filter(run=run, status=EvalEpisode.Status.RUNNING).update(status=EvalEpisode.Status.PENDING)
    agent = run.agent
    trusted = set(agent.trusted_tools or [])
    return RunPlan(
        run_id=run.id, caller=team_caller(team=run.team),
        env_ref=f"{run.environment.team.slug}/{run.environment.slug}@{run.version.number}",
        version_id=run.version_id, split=run.split,
        indices=list(EvalEpisode.objects.filter(run=run).exclude(status=EvalEpisode.Status.SCORED)
                     .order_by("task_index").values_list("task_index", flat=True)),
        concurrency=run.concurrency, max_turns=run.max_turns, pass_threshold=run.pass_threshold,
        turn_timeout=run.turn_timeout or settings.ORS_EVAL_TURN_TIMEOUT_SECONDS,
        agent_url=agent.url, agent_name=agent.agent, agent_options=agent.options or {}, agent_stream=agent.stream,
        agent_protocol=int((agent.meta or {}).get("protocol_version") or 1),
        agent_tools=[{"name": t["name"], "trust": t["name"] in trusted}
                     for t in (agent.meta.get("tools") or []) if isinstance(t, dict) and t.get("name")],
        secret_names=list(run.secret_names or []), api_key=crypto.decrypt(agent.api_key_encrypted),
    )


def eval_run_renew(*, run_id: int, owner: str) -> str:
    """Renew this worker's lease; returns the run's status (a cancel is seen here)."""
    lease = _lease_end()
    EvalRun.objects.filter(id=run_id, lease_owner=owner, status=EvalRun.Status.RUNNING).update(lease_until=lease)
    run = EvalRun.objects.filter(id=run_id).values("status", "lease_owner").first()
    if run is None:
        return EvalRun.Status.CANCELLED
    if run["lease_owner"] != owner and run["status"] == EvalRun.Status.RUNNING:
        return "taken"  # another worker took it over (this one was thought dead): stop
    return run["status"]


def eval_run_end(*, run_id: int, owner: str, status: str, error: str = "") -> None:
    """The driving worker is done with the run: finished (or failed); a cancel already ended it."""
    EvalRun.objects.filter(id=run_id, lease_owner=owner, status=EvalRun.Status.RUNNING).update(
        status=status, error=error[:2000], finished_at=timezone.now(), lease_until=None)
    EvalRun.objects.filter(id=run_id, lease_owner=owner).update(lease_until=None)


def eval_episode_start(*, run_id: int, task_index: int, sid: str) -> None:
    EvalEpisode.objects.filter(run_id=run_id, task_index=task_index).exclude(
        status=EvalEpisode.Status.SCORED).update(status=EvalEpisode.Status.RUNNING, sid=sid, started_at=timezone.now())


@dataclass
class EpisodeScore:
    task_index: int
    sid: str
    reward: float
    passed: bool
    finished: bool
    stop_reason: str
    error: str
    turns: int
    tool_calls: int
    input_tokens: int | None
    output_tokens: int | None
    transcript: list[dict]
    duration_s: float


def eval_episode_score(*, run_id: int, score: EpisodeScore) -> None:
    """Record an episode's result; a scored episode is never run again (resume skips it)."""
    from orsplatform.episodes.models import Session

    session_id = Session.objects.filter(sid=score.sid).values_list("id", flat=True).first() if score.sid else None
    EvalEpisode.objects.filter(run_id=run_id, task_index=score.task_index).update(
        status=EvalEpisode.Status.SCORED, sid=score.sid, session_id=session_id, reward=score.reward,
        passed=score.passed, finished=score.finished, stop_reason=score.stop_reason, error=score.error[:4000],
        turns=score.turns, tool_calls=score.tool_calls, input_tokens=score.input_tokens,
        output_tokens=score.output_tokens, transcript=score.transcript, ended_at=timezone.now(),
        duration_s=score.duration_s)


def eval_episode_release(*, run_id: int, task_index: int) -> None:
    """An episode interrupted by a cancel: back to pending, so a resume runs it."""
    EvalEpisode.objects.filter(run_id=run_id, task_index=task_index, status=EvalEpisode.Status.RUNNING).update(
        status=EvalEpisode.Status.PENDING)
