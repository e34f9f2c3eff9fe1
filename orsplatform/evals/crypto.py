"""What an evaluation must keep but nobody may read back. Fernet (AES-CBC + HMAC) with keys derived
from ORS_AGENT_KEY_SECRET, so rotating SECRET_KEY alone does not lose them when the operator set it.

- Agents' API keys are stored encrypted (`encrypt` / `decrypt`): a run needs them long after the
  team typed them.
- A run's environment secrets are never stored: they are sealed into the run's Celery message
  (`seal_run_secrets`), bound to the run's id, and opened only by the worker that drives it, which
  keeps them in memory. The broker holds ciphertext; the database holds only their names."""

from __future__ import annotations

import base64
import hashlib
import json

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet(purpose: bytes = b"orsplatform.evals:") -> Fernet:
    digest = hashlib.sha256(purpose + settings.ORS_AGENT_KEY_SECRET.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


RUN_SECRETS = b"orsplatform.evals.run-secrets:"  # another key: a stored agent key never opens as a run's secrets


def encrypt(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode() if value else ""


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        # The operator changed ORS_AGENT_KEY_SECRET: the agent must be registered again.
        raise ValueError("The stored secret cannot be decrypted (ORS_AGENT_KEY_SECRET changed).") from None


def seal_run_secrets(run_id: int, secrets: dict[str, str] | None) -> str:
    """The run's secrets for its Celery message ("" when there are none)."""
    if not secrets:
        return ""
    return _fernet(RUN_SECRETS).encrypt(json.dumps({"run": run_id, "secrets": secrets}).encode()).decode()


def open_run_secrets(run_id: int, sealed: str) -> dict[str, str]:
    """The secrets a run's message carries; ValueError when they do not open, or were sealed for
    another run (a message copied from one run to another gives nothing away)."""
    if not sealed:
        return {}
    try:
        value = json.loads(_fernet(RUN_SECRETS).decrypt(sealed.encode()))
    except (InvalidToken, ValueError):
        raise ValueError("The run's secrets do not open (ORS_AGENT_KEY_SECRET changed?).") from None
    if not isinstance(value, dict) or value.get("run") != run_id:
        raise ValueError("The sealed secrets belong to another run.")
    return value["secrets"]
