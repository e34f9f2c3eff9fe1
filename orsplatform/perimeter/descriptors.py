"""The process's file-descriptor budget: client sockets may use all of it but a headroom, which
stays for what keeps the server serving (database and Redis connections, sandbox workers' pipes,
packages, logs, and the accept loop itself)."""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger("orsplatform.perimeter")


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (systemd and shells start at 1024 while the
    hard limit is far higher) and return the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard or hard == resource.RLIM_INFINITY and soft < 1 << 20:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a container may forbid it; the cap follows what is in force
            logger.warning("could not raise the open-files limit from %s to %s: %s", soft, target, exc)
    return soft


def connection_cap(*, configured: int, headroom: int) -> int:
    """How many client connections one process keeps: the setting, but never closer than
    `headroom` descriptors to the open-files limit (at least 16, so a tiny limit still serves)."""
    soft = raise_descriptor_limit()
    return max(16, min(configured, soft - headroom))
