"""Writes of the verify app: planning a version's verification at publish, running it (a Celery
task's body), the author's confirmation, and the environment's replay settings."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.celery import task
from orsplatform.verify import config, report
from orsplatform.verify.models import Verification, VerifySettings
from orsplatform.verify.replay import Call, Episode, Progress, Replayed, replay_in_thread
from orsplatform.verify.selectors import full_specs, has_recorded_episodes, recorded_episodes

logger = logging.getLogger(__name__)


class NothingToConfirm(Exception):
    """The version is not waiting for its author (it passed, is current, or is still running)."""


def verify_effective(*, environment: Environment, manifest: dict) -> tuple[int, float | None]:
    """(sample size, threshold or None for report only): the console/REST setting, else the
    manifest's [verify] table, else the platform's default."""
    from_manifest = config.manifest_verify(manifest)
    chosen = VerifySettings.objects.filter(environment=environment).first()
    sample = next(v for v in (chosen and chosen.sample_size, from_manifest.sample,
                              settings.ORS_REPLAY_DEFAULT_SAMPLE) if v is not None)
    if chosen is not None and chosen.report_only:
        threshold = None
    elif chosen is not None and chosen.threshold is not None:
        threshold = chosen.threshold
    else:
        threshold = from_manifest.threshold
    return sample, threshold


def verification_plan(*, environment: Environment, version: EnvironmentVersion, manifest: dict,
                      baseline: EnvironmentVersion | None) -> bool:
    """Record the verification a newly published version gets and queue it after the commit;
    True when the version must wait for it before it is made current (a threshold is set and there
    is a version to compare with, or the package ships reference solutions). Called by catalog
    publishing inside its transaction, with the environment locked."""
    sample, threshold = verify_effective(environment=environment, manifest=manifest)
    solutions = len(config.read_solutions(Path(version.package_path)))
    # Nothing recorded to replay (a version nobody of the team has run yet): no replay is queued.
    replay = (baseline is not None and baseline.id != version.id and sample > 0
              and has_recorded_episodes(team=environment.team_id, version=baseline))
    if not replay and not solutions:
        Verification.objects.filter(version=version).delete()  # a failed attempt's, if any
        return False
    gated = bool(solutions) or threshold is not None
    verification, _ = Verification.objects.update_or_create(version=version, defaults={
        "baseline": baseline if replay else None, "status": Verification.Status.QUEUED, "gated": gated,
        "sample_size": sample if replay else 0, "threshold": threshold, "solutions": solutions,
        "items_total": 0, "items_done": 0, "agreement": None, "report": {}, "error": "",
        "started_at": None, "finished_at": None, "confirmed_by": None, "confirmed_at": None,
    })
    transaction.on_commit(lambda: _dispatch(verification.id))
    return gated


def _dispatch(verification_id: int) -> None:
    task("verify.replay").delay(verification_id)


def _solution_episodes(environment: Environment, solutions: list[config.Solution]
                       ) -> tuple[list[Episode], dict[str, str]]:
    """The reference solutions as episodes (on the stored, full task spec), and the reasons of
    those that cannot run, by key."""
    specs = full_specs(environment=environment, wanted={(s.split, s.index) for s in solutions})
    episodes, missing = [], {}
    for solution in solutions:
        key = f"solution:{solution.line}"
        spec = specs.get((solution.split, solution.index))
        if spec is None:
            missing[key] = f"no task {solution.split}/{solution.index} in this environment"
            continue
        episodes.append(Episode(key=key, task=f"{solution.split}/{solution.index}", task_spec=spec,
                                calls=tuple(Call(name=n, input=i) for n, i in solution.calls)))
    return episodes, missing


def _replay(verification: Verification, episodes: list[Episode]) -> list[Replayed]:
    version = verification.version
    progress = Progress()
    timeout = float(version.manifest.get("tool_timeout_seconds") or settings.ORS_DEFAULT_TOOL_TIMEOUT_SECONDS)
    thread = replay_in_thread(
        episodes, progress=progress, package_dir=version.package_path, entrypoint=version.entrypoint,
        team=version.environment.team.slug, label=f"{version.environment.full_name}@{version.number}",
        tool_timeout=timeout, setup_timeout=settings.ORS_SANDBOX_START_SECONDS + timeout,
        concurrency=settings.ORS_REPLAY_CONCURRENCY, threads=settings.ORS_TOOL_THREADS)
    written = 0
    while thread.is_alive():
        thread.join(settings.ORS_REPLAY_PROGRESS_SECONDS)
        if progress.done != written:  # the build page's progress bar polls this row
            written = progress.done
            Verification.objects.filter(id=verification.id).update(items_done=written)
    if thread.error is not None:
        raise thread.error
    return thread.result


def verification_run(*, verification_id: int) -> Verification:
    """Run a queued verification once (a redelivered task finds it claimed and does nothing),
    unless it has been running for ORS_REPLAY_STALE_SECONDS: its process died (the task is acked
    late, so a killed worker's task comes back) and this delivery takes it up again."""
    now = timezone.now()
    stale = now - timezone.timedelta(seconds=settings.ORS_REPLAY_STALE_SECONDS)
    claimed = Verification.objects.filter(
        Q(status=Verification.Status.QUEUED) | Q(status=Verification.Status.RUNNING, started_at__lt=stale),
        id=verification_id).update(status=Verification.Status.RUNNING, started_at=now)
    verification = Verification.objects.select_related("version__environment__team", "baseline").get(
        id=verification_id)
    if not claimed:
        return verification
    try:
        return _run(verification)
    except Exception as exc:  # it must end, never stay "running"; a held version stays held
        logger.exception("verification %s failed", verification_id)
        verification.status, verification.finished_at = Verification.Status.ERROR, timezone.now()
        verification.error = f"The replay could not run ({type(exc).__name__}); confirm the version to serve it."
        verification.save(update_fields=["status", "finished_at", "error"])
        return verification


def _run(verification: Verification) -> Verification:
    version = verification.version
    environment = version.environment
    recorded = (recorded_episodes(team=environment.team_id, version=verification.baseline,
                                  sample_size=verification.sample_size) if verification.baseline else [])
    solutions = config.read_solutions(Path(version.package_path))
    solution_episodes, missing = _solution_episodes(environment, solutions)
    verification.items_total = len(recorded) + len(solution_episodes)
    verification.save(update_fields=["items_total"])
    replayed = _replay(verification, recorded + solution_episodes) if verification.items_total else []
    by_key = {r.episode.key: r for r in replayed[len(recorded):]}
    episodes = report.episodes_report(replayed[:len(recorded)])
    checked = report.solutions_report([
        ({"line": s.line, "split": s.split, "index": s.index, "expected_reward": s.expected_reward},
         by_key.get(f"solution:{s.line}") or missing.get(f"solution:{s.line}", "not run"))
        for s in solutions])
    below = (verification.threshold is not None and episodes["agreement"] is not None
             and episodes["agreement"] < verification.threshold)
    passed = not below and checked["failed"] == 0
    verification.report = {**episodes, "baseline": verification.baseline.number if verification.baseline else None,
                           "below_threshold": below, "solutions": checked}
    verification.agreement = episodes["agreement"]
    verification.items_done = verification.items_total
    verification.finished_at = timezone.now()
    with transaction.atomic():
        locked = Environment.objects.select_for_update().get(id=environment.id)
        if not verification.gated:
            verification.status = Verification.Status.REPORTED
        elif passed:
            verification.status = Verification.Status.PASSED
            current = locked.current_version
            # Made current unless a newer version became current while this one was checked.
            if current is None or current.number < version.number:
                locked.current_version = version
                locked.save(update_fields=["current_version"])
        else:
            verification.status = Verification.Status.HELD
        verification.save()
    return verification


def verification_confirm(*, verification: Verification, user=None) -> Verification:
    """The author serves a held version anyway (below the threshold, failing reference solutions,
    or a replay that could not run): it becomes current."""
    with transaction.atomic():
        locked = Verification.objects.select_for_update().select_related("version").get(id=verification.id)
        if locked.status not in (Verification.Status.HELD, Verification.Status.ERROR) or not locked.gated:
            raise NothingToConfirm(f"Version {locked.version.number} is not waiting for a confirmation "
                                   f"(its verification is {locked.status}).")
        if locked.version.status != EnvironmentVersion.Status.READY:
            raise NothingToConfirm(f"Version {locked.version.number} is not ready.")
        environment = Environment.objects.select_for_update().get(id=locked.version.environment_id)
        environment.current_version = locked.version
        environment.save(update_fields=["current_version"])
        locked.status, locked.confirmed_at = Verification.Status.CONFIRMED, timezone.now()
        locked.confirmed_by = user if getattr(user, "is_authenticated", False) and getattr(user, "pk", None) else None
        locked.save(update_fields=["status", "confirmed_at", "confirmed_by"])
    return locked


def verify_settings_set(*, environment: Environment, sample_size: int | None, threshold: float | None,
                        report_only: bool) -> VerifySettings:
    """The author's replay settings for the next versions (null fields: the manifest, then the default)."""
    if sample_size is not None and not 0 <= sample_size <= settings.ORS_REPLAY_MAX_SAMPLE:
        raise ValueError(f"sample_size must be in [0, {settings.ORS_REPLAY_MAX_SAMPLE}].")
    if threshold is not None and not 0 <= threshold <= 1:
        raise ValueError("threshold must be in [0, 1].")
    chosen, _ = VerifySettings.objects.update_or_create(environment=environment, defaults={
        "sample_size": sample_size, "threshold": None if report_only else threshold, "report_only": report_only})
    return chosen
