"""Encryption at rest for what an evaluation must keep but nobody may read back: agents' API keys
and a run's environment secrets. Fernet (AES-CBC + HMAC) with a key derived from
ORS_AGENT_KEY_SECRET, so rotating SECRET_KEY alone does not lose them when the operator set it."""

from __future__ import annotations

import base64
import hashlib
import json

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


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


def encrypt_json(value: dict) -> str:
    return encrypt(json.dumps(value)) if value else ""


def decrypt_json(token: str) -> dict:
    return json.loads(decrypt(token)) if token else {}
