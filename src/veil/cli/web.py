"""For whoever hosts the survey page: `veil survey serve`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veil.cli.common import read_pem, setup_logging


def _fail(message: str) -> int:
    print(f"veil survey serve: {message}", file=sys.stderr)
    return 2


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from veil.grpc_util import bind_socket, is_loopback
    from veil.trust import TrustError
    from veil.web import ServeError, ServeLimits, SurveySite, build_app

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
    for name in ("max_body", "max_reports", "rate"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return _fail(f"--{name.replace('_', '-')} must be at least 1")
    if args.body_timeout <= 0:
        return _fail("--body-timeout must be positive")
    limits = ServeLimits(
        max_body=args.max_body,
        max_reports=args.max_reports,
        rate=args.rate,
        per=60.0,
        body_timeout=args.body_timeout,
    )
    try:
        site = SurveySite(
            Path(args.survey_dir),
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
            limits=limits,
        )
    except (OSError, ServeError, TrustError, ValueError) as e:
        return _fail(str(e))
    config = uvicorn.Config(
        build_app(site),
        host=host.strip("[]"),
        port=int(port),
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        log_level=args.log_level.lower(),
        # Client addresses for the rate limit are the peers' own: trusting
        # X-Forwarded-For would let anyone choose theirs.
        proxy_headers=False,
        server_header=False,
        date_header=False,
        limit_concurrency=args.max_connections,
        timeout_keep_alive=5,
    )
    # Bound here, before saying "serving": a port in use is said as such.
    try:
        listener = bind_socket(args.listen)
    except OSError as e:
        site.close()
        return _fail(f"cannot listen on {args.listen}: {e}")
    print(f"serving the survey on {'https' if args.tls_cert else 'http'}://{args.listen}/")
    sys.stdout.flush()
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
        site.close()
    return 0


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
        "--rate", type=int, default=20, help="requests per minute from one client address"
    )
    p.add_argument(
        "--body-timeout", type=float, default=10.0, help="seconds to receive a request's body"
    )
    p.add_argument("--max-connections", type=int, default=1000, help="concurrent connections")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_serve)
