"""Celery tasks of evaluations: a run is driven by the worker that takes its task."""

from __future__ import annotations

from django.conf import settings

from orsplatform.celery import app


@app.task(name="evals.run_eval", acks_late=True, reject_on_worker_lost=True)
def run_eval(run_id: int, generation: int | None = None, sealed: str = "", recheck: bool = False) -> None:
    """Drive run `run_id`. `sealed` is the run's environment secrets sealed to it (evals/crypto.py):
    the database never has them, so this message is where they live until the run ends; acks_late
    keeps it on the broker while the run is driven, so a killed worker's message comes back with
    them, and every continuation below carries them on unchanged."""
    from orsplatform.evals.engine import SLICE, engine
    from orsplatform.evals.services import Claim

    # Eager (the embedded default, no broker): the caller is a web request or a shell; the run goes
    # on in this process's engine without holding it. A real worker waits, so its concurrency
    # bounds the runs it drives and a lost worker's task is redelivered.
    if run_eval.request.is_eager:
        engine().execute(run_id, generation=generation, sealed=sealed, wait=False)
        return
    outcome = engine().execute(run_id, generation=generation, sealed=sealed, wait=True,
                               budget=settings.ORS_EVAL_SLICE_SECONDS)
    # Sent before this message is acknowledged (on return): a worker killed in between leaves two
    # messages of one generation, and the run's lease lets only one of them drive it.
    if outcome == SLICE:
        run_eval.apply_async(args=[run_id, generation, sealed])
    elif outcome == Claim.BUSY:
        run_eval.apply_async(args=[run_id, generation, sealed], countdown=max(0.5, settings.ORS_EVAL_LEASE_SECONDS / 3))
    elif outcome == Claim.TAKEN and not recheck:
        # Another worker's lease on this generation: a live worker (this is a duplicate), or a dead
        # one whose lease has not lapsed yet (RabbitMQ hands a killed worker's message on at once).
        # Look once more when the lease would have lapsed: by then a dead worker's run is free, and
        # a live one has renewed its lease and holds its own message, so this one is dropped.
        run_eval.apply_async(args=[run_id, generation, sealed, True], countdown=settings.ORS_EVAL_LEASE_SECONDS + 1)
