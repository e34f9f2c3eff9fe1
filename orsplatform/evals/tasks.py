"""Celery tasks of evaluations: a run is driven by the worker that takes its task."""

from __future__ import annotations

from orsplatform.celery import app


@app.task(name="evals.run_eval", acks_late=True)
def run_eval(run_id: int) -> None:
    from orsplatform.evals.engine import engine

    # Eager (the embedded default, no broker): the caller is a web request or a shell; the run goes
    # on in this process's engine without holding it. A real worker waits, so its concurrency
    # bounds the runs it drives and a lost worker's task is redelivered.
    engine().execute(run_id, wait=not run_eval.request.is_eager)
