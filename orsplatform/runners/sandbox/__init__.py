"""Tenant code runs here: sandbox worker processes (worker.py) and the pool that supervises them
(pool.py), one pool per gateway (inline executor) or per runner node (celery executor)."""
