"""Who a link belongs to: an account (signed token) or a device (its secret).

The person key is a keyed hash (HMAC-SHA256 with the server secret) of the account or the
device secret, so neither the database nor the logs ever hold a secret in clear, and a key
cannot be turned back into the credential.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from pathlib import Path

import jwt

MIN_DEVICE_SECRET = 22
TOKEN_ALGORITHM = "HS256"


class Unauthorized(Exception):
    """The credentials were missing or did not verify. The message names no secret."""


class Identity:
    def __init__(self, secret: str) -> None:
        self._key = secret.encode()

    def person(self, *, device: object = None, token: object = None) -> str:
        """The person key for a hello's credentials; raises Unauthorized."""
        if isinstance(token, str) and token:
            return self._keyed("account", self.verify(token))
        if isinstance(device, str):
            if len(device) < MIN_DEVICE_SECRET:
                raise Unauthorized(f"a device secret has at least {MIN_DEVICE_SECRET} characters")
            return self._keyed("device", device)
        raise Unauthorized("a hello needs a device secret or an account token")

    def issue(self, account: str, ttl_s: int = 30 * 24 * 3600) -> str:
        now = int(time.time())
        claims = {"sub": account, "iat": now, "exp": now + ttl_s}
        return jwt.encode(claims, self._key, algorithm=TOKEN_ALGORITHM)

    def verify(self, token: str) -> str:
        try:
            claims = jwt.decode(
                token, self._key, algorithms=[TOKEN_ALGORITHM], options={"require": ["sub", "exp"]}
            )
        except jwt.ExpiredSignatureError as expired:
            raise Unauthorized("the account token has expired") from expired
        except jwt.InvalidTokenError as invalid:
            raise Unauthorized("the account token does not verify") from invalid
        return str(claims["sub"])

    def _keyed(self, kind: str, value: str) -> str:
        return hmac.new(self._key, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()


def load_or_create_secret(data_dir: Path) -> str:
    """The signing secret kept in the data dir, made once on first start (mode 0600)."""
    path = data_dir / "secret"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    path.touch(mode=0o600)
    path.write_text(secret + "\n")
    return secret
