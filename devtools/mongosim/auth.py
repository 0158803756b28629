"""Server side of SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 5802 / 7677) for one configured user.

The user lives in the ``admin`` database, as a user created with ``--auth USER:PASSWORD``.
Conversations run through ``saslStart``/``saslContinue`` or ``speculativeAuthenticate`` in the
handshake; a wrong password fails with code 18 AuthenticationFailed ("Authentication failed."),
exactly as mongod answers (it never says whether the user or the password was wrong).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stringprep
import unicodedata

from devtools.mongosim.errors import CommandError

MECHANISMS = {"SCRAM-SHA-1": ("sha1", 10000), "SCRAM-SHA-256": ("sha256", 15000)}


def auth_failed() -> CommandError:
    return CommandError(18, "Authentication failed.")


def saslprep(text: str) -> str:
    """RFC 4013 SASLprep (what pymongo applies to SCRAM-SHA-256 passwords)."""
    mapped = "".join(" " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c))
    normalized = unicodedata.normalize("NFKC", mapped)
    for char in normalized:
        if (
            stringprep.in_table_c21(char)
            or stringprep.in_table_c22(char)
            or stringprep.in_table_c3(char)
            or stringprep.in_table_c4(char)
            or stringprep.in_table_c5(char)
            or stringprep.in_table_c6(char)
            or stringprep.in_table_c7(char)
            or stringprep.in_table_c8(char)
            or stringprep.in_table_c9(char)
        ):
            raise ValueError("password contains a prohibited character")
    return normalized


class Credentials:
    def __init__(self, user: str, password: str):
        self.user = user
        self.keys = {}
        for mechanism, (digest, iterations) in MECHANISMS.items():
            salt = os.urandom(16 if digest == "sha1" else 28)
            if mechanism == "SCRAM-SHA-1":
                secret = hashlib.md5(f"{user}:mongo:{password}".encode()).hexdigest().encode()
            else:
                secret = saslprep(password).encode()
            salted = hashlib.pbkdf2_hmac(digest, secret, salt, iterations)
            client_key = hmac.new(salted, b"Client Key", digest).digest()
            self.keys[mechanism] = {
                "digest": digest,
                "iterations": iterations,
                "salt": salt,
                "stored_key": hashlib.new(digest, client_key).digest(),
                "server_key": hmac.new(salted, b"Server Key", digest).digest(),
            }


def _parse(message: bytes) -> dict:
    fields = {}
    for part in message.decode("utf-8").split(","):
        if len(part) >= 2 and part[1] == "=":
            fields[part[0]] = part[2:]
    return fields


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class Conversation:
    def __init__(self, credentials: Credentials, mechanism: str, payload: bytes):
        if mechanism not in MECHANISMS:
            raise CommandError(
                2,
                f"Received authentication for mechanism {mechanism} which is not enabled",
                code_name="MechanismUnavailable",
            )
        text = payload.decode("utf-8")
        if not text.startswith("n,"):
            raise auth_failed()
        self.gs2_header, _, self.client_first_bare = text.partition(",,")
        self.gs2_header += ",,"
        fields = _parse(self.client_first_bare.encode())
        self.user = _unescape(fields.get("n", ""))
        self.client_nonce = fields.get("r", "")
        self.mechanism = mechanism
        self.keys = credentials.keys[mechanism] if self.user == credentials.user else None
        self.nonce = self.client_nonce + base64.b64encode(os.urandom(24)).decode()
        keys = self.keys or {"salt": os.urandom(16), "iterations": MECHANISMS[mechanism][1]}
        self.server_first = (
            f"r={self.nonce},s={base64.b64encode(keys['salt']).decode()},i={keys['iterations']}"
        )
        self.done = False

    def first_reply(self) -> bytes:
        return self.server_first.encode()

    def finish(self, payload: bytes) -> bytes:
        """Verify the client proof; returns the server-final message."""
        fields = _parse(payload)
        if self.keys is None or fields.get("r") != self.nonce or "p" not in fields:
            raise auth_failed()
        without_proof = payload.decode("utf-8").rsplit(",p=", 1)[0]
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        digest = self.keys["digest"]
        client_signature = hmac.new(self.keys["stored_key"], auth_message, digest).digest()
        try:
            proof = base64.b64decode(fields["p"])
        except ValueError as error:
            raise auth_failed() from error
        if len(proof) != len(client_signature):
            raise auth_failed()
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), self.keys["stored_key"]):
            raise auth_failed()
        server_signature = hmac.new(self.keys["server_key"], auth_message, digest).digest()
        self.done = True
        return f"v={base64.b64encode(server_signature).decode()}".encode()
