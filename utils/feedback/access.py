"""Who may give and read labels (/feedback): a server started with a token (a file, or the environment's
QA_AMP_FEEDBACK_TOKEN: never a flag's value, which `ps` shows to every user) takes only requests bearing it, 401
without; one started without a token takes anyone's on the loopback address (this machine's users) and refuses all
feedback on any other address (403), labels being writes and possibly private. A refused request changes nothing.
A proxy on this machine forwarding other machines' requests to a loopback server makes them local: give it a
token."""

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
        token, where = os.environ.get(TOKEN_ENV, "").strip(), TOKEN_ENV
        if not token:
            return None
    else:
        try:
            with open(token_file, encoding="utf-8") as f:
                token, where = f.readline().strip(), f"--feedback_token_file {token_file} (its first line)"
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"--feedback_token_file {token_file}: cannot read it "
                            f"({getattr(err, 'strerror', None) or err})") from None
    if len(token) < 16:
        raise UserError(f"{where}: the token must be at least 16 characters")
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
