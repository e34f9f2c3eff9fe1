"""Encryption for what an evaluation must carry but nobody may read back.

- Agents' API keys, at rest: Fernet (AES-CBC + HMAC) with a key derived from ORS_AGENT_KEY_SECRET,
  so rotating SECRET_KEY alone does not lose them when the operator set it.
- A run's environment secrets, never at rest: they travel only inside the run's Celery task message
  (so a redelivered or self-requeued task still has them), sealed with ChaCha20-Poly1305 under a
  key derived from the same setting for this purpose alone, bound to the run's id as associated
  data so a sealed blob copied into another run's message does not open. The broker (Redis keys,
  RabbitMQ queues) only ever holds the sealed form.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os

from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from django.conf import settings

RUN_SECRETS_VERSION = b"\x01"


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"orsplatform.evals:" + settings.ORS_AGENT_KEY_SECRET.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


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


# --- a run's secrets in its task message ------------------------------------------------------------

class SealedSecretsError(ValueError):
    """The sealed secrets of a task message do not open (key changed, or not this run's)."""


def _message_key() -> bytes:
    return hashlib.sha256(b"orsplatform.evals.run-message:" + settings.ORS_AGENT_KEY_SECRET.encode()).digest()


def seal_run_secrets(secrets: dict[str, str] | None, *, run_id: int) -> str:
    """`secrets` as an opaque string for the task message ("" when there are none)."""
    if not secrets:
        return ""
    nonce = os.urandom(12)
    body = ChaCha20Poly1305(_message_key()).encrypt(nonce, json.dumps(secrets).encode(), f"run:{run_id}".encode())
    return base64.urlsafe_b64encode(RUN_SECRETS_VERSION + nonce + body).decode()


def open_run_secrets(sealed: str, *, run_id: int) -> dict[str, str]:
    if not sealed:
        return {}
    try:
        blob = base64.urlsafe_b64decode(sealed.encode())
        if blob[:1] != RUN_SECRETS_VERSION:
            raise ValueError("unknown version")
        plain = ChaCha20Poly1305(_message_key()).decrypt(blob[1:13], blob[13:], f"run:{run_id}".encode())
        secrets = json.loads(plain)
    except (InvalidTag, ValueError, TypeError):
        raise SealedSecretsError("The run's sealed secrets do not open (ORS_AGENT_KEY_SECRET changed, or the "
                                 "message is not this run's).") from None
    if not isinstance(secrets, dict):
        raise SealedSecretsError("The run's sealed secrets are not an object.")
    return secrets
