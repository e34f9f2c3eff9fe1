"""The sandbox: Django-free, importing nothing of the platform outside this package (except the
loader and redaction rules binding.py lists, Django-free too). Tenant code runs here: sandbox worker
processes (worker.py) and the pool that supervises them (pool.py), one pool per gateway (inline
executor) or per runner node (celery executor); the children publishing and the environment pages
run (inspect.py), the syscall filter, cgroups and the build sandbox. What the Django side knows
(settings) it passes in: SandboxConfig.from_settings, framing.settings_lookup.

This file is also the stand-in ``__init__`` of every parent package inside a sandbox (binding.py):
it must import nothing."""
