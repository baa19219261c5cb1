"""Where a DAP peer may send a caller that carries a bearer token: the
``Location`` a leader or helper names (draft-ietf-ppm-dap section 3.1, a
resource polled until it is ready) is followed only within the resource
the request was made to, on the same origin; and no HTTP redirect is
followed at all.

A token goes where the task file says the peer is, never where an answer
points: a hostile or compromised peer, or a misconfigured proxy, could
otherwise send the caller's token to another origin (RFC 6454: scheme,
host and port), or to another task's resource at the same one.
"""

from __future__ import annotations

import ssl
import urllib.request
from email.message import Message
from typing import IO
from urllib.parse import unquote, urljoin, urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def resource_within(url: str, location: str, under: str) -> str:
    """`location` resolved against `url` (RFC 3986 section 5.2, as
    urljoin), provided it has `under`'s scheme, host and port, no user
    information and a path below `under`'s path, none of whose
    segments decodes to a dot segment. Raises ValueError naming it
    otherwise. `under` is an absolute http or https URL."""
    got = urljoin(url, location)
    there, base = urlsplit(got), urlsplit(under)
    try:
        same = (
            there.scheme.lower() == base.scheme.lower()
            and there.scheme.lower() in _DEFAULT_PORTS
            and there.hostname is not None
            and there.hostname == base.hostname
            and _port(there.scheme, there.port) == _port(base.scheme, base.port)
            and there.username is None
            and there.password is None
        )
    except ValueError:  # a port out of range or not a number
        same = False
    if not same:
        raise ValueError(f"the Location {location!r} is not on {_origin(under)}")
    root = base.path.rstrip("/")
    segments = there.path.split("/")
    if not (there.path.startswith(root + "/") and there.path != root + "/") or any(
        unquote(s) in (".", "..") or "/" in unquote(s) or "\\" in unquote(s) for s in segments
    ):
        raise ValueError(f"the Location {location!r} is not under {root or '/'}")
    return got


def _port(scheme: str, port: int | None) -> int:
    return _DEFAULT_PORTS[scheme.lower()] if port is None else port


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer, not a place to go: urllib would otherwise send
    the request's headers, its Authorization among them, wherever the
    answer's Location points."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> None:
        return None


def opener(tls: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener as `urllib.request.urlopen`'s (`tls` its `context`, None
    for the system's trust) that follows no redirect: a 3xx answer is an
    HTTPError with its status."""
    return urllib.request.build_opener(_NoRedirects(), urllib.request.HTTPSHandler(context=tls))
