"""Who may call a network surface: which hosts are this machine (the rule behind "no token ⇒ loopback only") and
the bearer-token check, the same for ``kindex serve`` and ``kindex mcp``; and URLs shown without their passwords."""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit, urlunsplit

SEND_TOKEN = "send the API token as `Authorization: Bearer <token>`"


def loopback(netloc: str) -> bool:
    """Whether a host, a Host header or an origin's host:port names this machine (localhost, 127.0.0.0/8, ::1)."""
    if netloc.startswith("["):
        host = netloc[1 : netloc.find("]")] if "]" in netloc else ""
    else:
        host = netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_refusal(authorization: bytes, token: str) -> str | None:
    """Why a request with this ``Authorization`` header may not pass (``None``: it may): a token missing and a token
    that is not the server's are told apart, so a client that sent one knows to check it, not to add it."""
    scheme, _, given = authorization.strip().partition(b" ")
    if not authorization.strip() or (scheme.lower() == b"bearer" and not given.strip()):
        return SEND_TOKEN
    if scheme.lower() != b"bearer":  # the scheme is case-insensitive (RFC 9110)
        return f"the Authorization header must be `Bearer <token>`: {SEND_TOKEN}"
    if not hmac.compare_digest(given.strip(), token.encode()):
        return "the API token sent is not this server's (KINDEX_API_TOKEN where it runs): check the token"
    return None


def redact_url(url: str) -> str:
    """``url`` without the credentials its user part holds (``http://user:secret@host/v1`` → ``http://***@host/v1``),
    for logs, notes and answers; one that does not parse is hidden whole."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
