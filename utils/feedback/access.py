"""Who may give and read labels (/feedback): on the loopback address anyone on this machine; on any other address,
labels being writes and possibly private, only a client with the token the server was started with (a file, or the
environment's QA_AMP_FEEDBACK_TOKEN: never a flag's value, which `ps` shows to every user): 401 without it. Without
a token such a server refuses all feedback (403); a refused request changes nothing."""

import hmac
import ipaddress
import os

from utils.errors import UserError

TOKEN_ENV = "QA_AMP_FEEDBACK_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None) -> str | None:
    """The token from `token_file` (its first line), else from the environment; None where neither gives one."""
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--feedback_token_file {token_file}: cannot read it ({getattr(err, 'strerror', err)})") \
            from None
    if len(token) < 16:
        raise UserError(f"--feedback_token_file {token_file}: the token must be at least 16 characters (its first "
                        "line)")
    return token


class FeedbackAccess:
    """`refusal(authorization)`: (status, why) where a request with that Authorization header may not use /feedback
    (401: the token is missing or wrong; 403: this server takes no feedback from anyone), or None."""

    def __init__(self, host: str, token: str | None):
        self.host, self.token, self.local = host, token, is_loopback(host)

    def refusal(self, authorization: str | None) -> str | None:
        if self.token is None:
            return None if self.local else (403, f"this server listens on {self.host} and was started without a "
                                                 f"feedback token (--feedback_token_file or {TOKEN_ENV}): it takes "
                                                 "no feedback")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return 401, "a valid token is needed: send `Authorization: Bearer TOKEN`"
        return None
