"""The episode gateway: where an episode lives, whatever protocol drives it.

Faces (ORS at the root in ``orsplatform/ors/``, OpenEnv under ``/openenv/``, the AAP evaluator on
Celery) parse their wire and call ``EpisodeGateway`` (``gateway.py``); it owns the live-session
registry, the executor, limits and the durable writes (``store.py``). Nothing here imports a face.
"""
