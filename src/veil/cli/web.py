"""For whoever hosts the survey page: `veil survey serve`."""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from pathlib import Path

from veil.cli.common import read_pem, setup_logging


def _fail(message: str) -> int:
    print(f"veil survey serve: {message}", file=sys.stderr)
    return 2


def cmd_serve(args: argparse.Namespace) -> int:
    import ssl

    from veil.grpc_util import bind_socket, is_loopback
    from veil.trust import TrustError
    from veil.web import ServeError, ServeLimits, SurveySite, build_app
    from veil.web.guard import serve, tls_context

    setup_logging(args.log_level)
    host, sep, port = args.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return _fail(f"--listen {args.listen!r} is not HOST:PORT")
    if (args.tls_cert is None) != (args.tls_key is None):
        return _fail("give both --tls-cert and --tls-key, or neither")
    if args.tls_cert is None and not is_loopback(args.listen):
        # Respondents' browsers run WebCrypto only on secure origins, and the
        # page must reach them unaltered: plaintext only on loopback (behind a
        # TLS-terminating proxy on the same machine, say).
        return _fail(f"refusing plaintext HTTP on {args.listen}: give --tls-cert and --tls-key")
    for name in ("max_body", "max_reports", "rate", "max_connections", "max_per_address"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return _fail(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.read_timeout <= 3600:
        return _fail("--read-timeout must be more than 0 and at most 3600 seconds")
    if not 0 < args.header_timeout <= 3600:
        return _fail("--header-timeout must be more than 0 and at most 3600 seconds")
    if args.proxy_header is not None and not _TOKEN.fullmatch(args.proxy_header):
        return _fail(f"--proxy-header {args.proxy_header!r} is not a header name")
    if args.trusted_proxy and args.proxy_header is None:
        return _fail("--trusted-proxy names where --proxy-header comes from: give --proxy-header")
    trusted = tuple(args.trusted_proxy or ("127.0.0.1", "::1"))
    for address in trusted:
        if not _is_ip(address):
            return _fail(f"--trusted-proxy {address!r} is not an IP address")
    limits = ServeLimits(
        max_body=args.max_body,
        max_reports=args.max_reports,
        rate=args.rate,
        per=60.0,
        read_timeout=args.read_timeout,
        header_timeout=args.header_timeout,
        max_connections=args.max_connections,
        max_per_address=args.max_per_address,
        proxy_header=args.proxy_header,
        trusted_proxies=trusted,
    )
    try:
        tls = None if args.tls_cert is None else tls_context(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as e:
        return _fail(f"cannot load --tls-cert/--tls-key: {e}")
    try:
        site = SurveySite(
            Path(args.survey_dir),
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
            limits=limits,
            issuer_dir=None if args.issuer_dir is None else Path(args.issuer_dir),
        )
    except (OSError, ServeError, TrustError, ValueError) as e:
        return _fail(str(e))
    # Bound here, before saying "serving": a port in use is said as such.
    try:
        listener = bind_socket(args.listen)
    except OSError as e:
        site.close()
        return _fail(f"cannot listen on {args.listen}: {e}")
    print(f"serving the survey on {'https' if tls else 'http'}://{args.listen}/")
    sys.stdout.flush()
    try:
        serve(build_app(site), listener, limits, tls=tls, log_level=args.log_level.lower())
    finally:
        listener.close()
        site.close()
    return 0


# An HTTP field name (RFC 9110 token).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def register(survey: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = survey.add_parser(
        "serve",
        help="serve the survey's web page; answers are sealed in the respondent's browser",
        description=(
            "Serve the survey page of a deployment's client/ directory. Each answer is split"
            " into shares and sealed to the two aggregators in the respondent's browser; this"
            " server forwards only the sealed reports to the leader."
        ),
    )
    p.add_argument("--survey-dir", required=True, help="a deployment's client/ directory")
    p.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    p.add_argument(
        "--issuer-dir",
        help="a survey with invitations: the deployment's issuer/ directory (serves"
        " POST /invitation beside the page)",
    )
    p.add_argument("--tls-cert", help="PEM certificate chain for HTTPS")
    p.add_argument("--tls-key", help="PEM key of --tls-cert")
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    p.add_argument("--helper-ca", help="PEM file of the CA of the helper (only the helper's)")
    p.add_argument("--client-cert", help="PEM client certificate, for an mTLS aggregator")
    p.add_argument("--client-key", help="PEM key of --client-cert")
    p.add_argument("--max-body", type=int, default=64 * 1024, help="bytes per request")
    p.add_argument(
        "--max-reports", type=int, help="reports per request (default: one per question)"
    )
    p.add_argument(
        "--rate",
        type=int,
        default=20,
        help="uploads a minute from one client address, counted once an upload is read and"
        " found well-formed (default 20)",
    )
    p.add_argument(
        "--read-timeout",
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds from a connection's start, or its previous response, to a whole"
        " request, headers and body (default 10)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=3.0,
        help="seconds from a connection's start, TLS handshake included, or its previous"
        " response, to a request's whole headers (default 3; at most --read-timeout)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        help="connections open at once; a newcomer beyond them ends the connection that has"
        " waited longest for its request (default: an eighth of the memory available at start"
        " at --max-body + 64 KiB a connection, within the open-file limit)",
    )
    p.add_argument(
        "--max-per-address",
        type=int,
        default=32,
        help="connections open at once from one client address, an IPv6 /64 counting as"
        " one (default 32; a trusted proxy has no such cap)",
    )
    p.add_argument(
        "--proxy-header",
        help="behind a reverse proxy: the header in which it passes the client's address"
        " (e.g. X-Forwarded-For; its last address is taken); default: none, the TCP peer's"
        " address is the client's",
    )
    p.add_argument(
        "--trusted-proxy",
        action="append",
        metavar="ADDRESS",
        help="an address whose --proxy-header is believed (repeat for several;"
        " default 127.0.0.1 and ::1)",
    )
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_serve)
