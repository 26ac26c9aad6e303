"""Who a link belongs to: an account (signed token) or a device (its secret).

The person key is a keyed hash (HMAC-SHA256 with the server secret) of the account or the
device secret, so neither the database nor the logs ever hold a secret in clear, and a key
cannot be turned back into the credential.

A token's expiry is enforced with `TOKEN_LEEWAY_S` of allowance for clocks that disagree
(the issuer's and this server's): a token is accepted until `exp + 60 s`, and refused if
it claims to be issued (`iat`) or valid from (`nbf`) more than 60 s in the future.
A revoked person (`stillhere revoke`, transport/revocations.py) is refused whatever its
credentials.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Container
from pathlib import Path

import jwt

MIN_DEVICE_SECRET = 22
TOKEN_ALGORITHM = "HS256"
TOKEN_LEEWAY_S = 60
DEFAULT_TOKEN_TTL_S = 30 * 24 * 3600


class Unauthorized(Exception):
    """The credentials were missing or did not verify. The message names no secret."""

    code = "unauthorized"
    status = 401  # as an HTTP answer


class Revoked(Unauthorized):
    """The credentials verify, but their person has been revoked."""

    code = "revoked"
    status = 403


class Identity:
    def __init__(self, secret: str, revoked: Container[str] = frozenset()) -> None:
        self._key = secret.encode()
        self.revoked = revoked  # person keys refused (kept current by the server's watch)

    def person(self, *, device: object = None, token: object = None) -> str:
        """The person key for a hello's credentials; raises Unauthorized (or Revoked)."""
        key = self.key(device=device, token=token)
        if key in self.revoked:
            raise Revoked("this account or device has been revoked")
        return key

    def key(self, *, device: object = None, token: object = None) -> str:
        """The person key the credentials stand for, revoked or not."""
        if isinstance(token, str) and token:
            return self.account_key(self.verify(token))
        if isinstance(device, str):
            if len(device) < MIN_DEVICE_SECRET:
                raise Unauthorized(f"a device secret has at least {MIN_DEVICE_SECRET} characters")
            return self._keyed("device", device)
        raise Unauthorized("a hello needs a device secret or an account token")

    def account_key(self, account: str) -> str:
        return self._keyed("account", account)

    def issue(self, account: str, ttl_s: float = DEFAULT_TOKEN_TTL_S) -> str:
        now = int(time.time())
        claims = {"sub": account, "iat": now, "exp": now + int(ttl_s)}
        return jwt.encode(claims, self._key, algorithm=TOKEN_ALGORITHM)

    def verify(self, token: str) -> str:
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[TOKEN_ALGORITHM],
                options={"require": ["sub", "exp"]},
                leeway=TOKEN_LEEWAY_S,
            )
        except jwt.ExpiredSignatureError as expired:
            raise Unauthorized("the account token has expired") from expired
        except jwt.ImmatureSignatureError as early:
            raise Unauthorized("the account token is not valid yet (iat or nbf ahead)") from early
        except jwt.InvalidTokenError as invalid:
            raise Unauthorized("the account token does not verify") from invalid
        return str(claims["sub"])

    def _keyed(self, kind: str, value: str) -> str:
        return hmac.new(self._key, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()


def route_of(person: str) -> str:
    """The person's routing key (`welcome`'s `route`): what a load balancer hashes to send
    the person to the node that has them. Stable across conversations and restarts (the
    person key is a keyed hash of the credential, the same on every node sharing a secret),
    short, URL-safe, and a one-way hash of it: it reveals nothing."""
    digest = hashlib.sha256(f"route:{person}".encode()).digest()
    return base64.urlsafe_b64encode(digest[:12]).decode()


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
