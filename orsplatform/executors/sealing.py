"""Secrets sealed to the runner node that will run the session (celery executor).

A setup message waits in a Redis list that anything with broker access could read (a node that
consumed another's queue, a MONITOR). So a gateway never puts secrets there in clear: each start of a
node draws an X25519 key pair, announces the public half in its heartbeat, and keeps the private
half in memory; the gateway seals the secrets to that key (an ephemeral X25519 exchange, HKDF-SHA256,
ChaCha20-Poly1305, the session id as associated data, so a sealed blob opens only for its session).
No Django here: runner nodes import it.
"""

from __future__ import annotations

import base64
import os

import orjson
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEALED = "__sealed__"  # the key a sealed secrets dict travels under
INFO = b"ors-sealed-secrets-v1"
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


class SealError(Exception):
    pass


def _key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO + ephemeral + recipient).derive(shared)


class NodeKey:
    """A node's key pair for one start of the node."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public = base64.b64encode(self._private.public_key().public_bytes(*RAW)).decode()

    def open(self, sealed: dict, sid: str) -> dict[str, str]:
        """The secrets of a setup message: unsealed, or {} when there were none."""
        if not sealed:
            return {}
        if set(sealed) != {SEALED}:
            raise SealError("Secrets must arrive sealed to this node.")
        blob = base64.b64decode(sealed[SEALED])
        ephemeral, nonce, body = blob[:32], blob[32:44], blob[44:]
        recipient = base64.b64decode(self.public)
        key = _key(self._private.exchange(X25519PublicKey.from_public_bytes(ephemeral)), ephemeral, recipient)
        try:
            return orjson.loads(ChaCha20Poly1305(key).decrypt(nonce, body, sid.encode()))
        except Exception as exc:  # InvalidTag: not for this node, or not for this session
            raise SealError("The sealed secrets do not open with this node's key.") from exc


def seal(public: str, secrets: dict[str, str], sid: str) -> dict:
    """`secrets` sealed to the node whose heartbeat announced `public` ({} when there are none)."""
    if not secrets:
        return {}
    recipient = base64.b64decode(public)
    ephemeral_key = X25519PrivateKey.generate()
    ephemeral = ephemeral_key.public_key().public_bytes(*RAW)
    key = _key(ephemeral_key.exchange(X25519PublicKey.from_public_bytes(recipient)), ephemeral, recipient)
    nonce = os.urandom(12)
    body = ChaCha20Poly1305(key).encrypt(nonce, orjson.dumps(secrets), sid.encode())
    return {SEALED: base64.b64encode(ephemeral + nonce + body).decode()}
