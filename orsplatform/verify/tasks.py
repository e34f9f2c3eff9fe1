"""Celery tasks of the verify app. Thin: they take ids and call a service."""

from __future__ import annotations

from orsplatform.celery import app


@app.task(name="verify.replay", acks_late=True)
def replay(verification_id: int) -> None:
    from orsplatform.verify.services import verification_run

    verification_run(verification_id=verification_id)
