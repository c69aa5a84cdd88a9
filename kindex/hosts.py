"""Which hosts are this machine: the rule behind "no token ⇒ loopback only" for every network surface."""

from __future__ import annotations

import ipaddress


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
