"""Celery tasks of evaluations: a run is driven by the worker that takes its task."""

from __future__ import annotations

from orsplatform.celery import app


@app.task(name="evals.run_eval", acks_late=True)
def run_eval(run_id: int, sealed_secrets: str = "") -> None:
    from orsplatform.evals.engine import engine

    # The worker waits for the run, so its concurrency bounds the runs it drives and a lost
    # worker's task is redelivered (acks_late), secrets included.
    engine().execute(run_id, sealed_secrets=sealed_secrets)


@app.task(name="evals.resume_orphaned_runs")
def resume_orphaned_runs() -> tuple[int, int]:
    """Beat: a run whose worker died goes on elsewhere without anyone asking (services)."""
    from orsplatform.evals.services import eval_runs_resume_orphaned

    return eval_runs_resume_orphaned()
