"""For the survey operator of a survey with invitations: `veil survey invite`
(mint invitation codes) and `veil survey issuer` (redeem them, for surveys
answered with `veil survey respond`; `veil survey serve --issuer-dir` serves
the same endpoint beside the page)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veil.cli.common import setup_logging


def issuer_dir(path: str) -> Path:
    """The issuer/ directory: PATH itself, or PATH/issuer for a deployment."""
    p = Path(path)
    return p / "issuer" if (p / "issuer").is_dir() else p


def issuer_keys_fingerprint(directory: Path) -> str:
    """The fingerprint of the issuer's keys (keys.pem, question order)."""
    from veil.invite.issuer import read_keys
    from veil.invite.token import keys_fingerprint, public_key_bytes

    return keys_fingerprint([public_key_bytes(k.public_key()) for k in read_keys(directory)])


def cmd_invite(args: argparse.Namespace) -> int:
    from veil.files import create_file
    from veil.invite.issuer import KEYS_FILE, IssuerError, mint

    name = "veil survey invite"
    directory = issuer_dir(args.deployment)
    if not (directory / KEYS_FILE).is_file():
        print(
            f"{name}: {directory} holds no issuer keys: give the directory `veil survey deploy`"
            " wrote for a survey with `invitations = true`",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.count <= 1_000_000:
        print(f"{name}: --count must be between 1 and 1,000,000", file=sys.stderr)
        return 2
    link = args.link
    if link is not None and ("#" in link or not link.startswith(("https://", "http://"))):
        print(f"{name}: --link must be an http(s) URL without a fragment", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() or out.is_symlink():
        print(f"{name}: {out} already exists; nothing was minted", file=sys.stderr)
        return 2
    try:
        codes = mint(directory, args.count)
    except (IssuerError, OSError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    fingerprint = issuer_keys_fingerprint(directory)
    lines = [f"{link}#invitation={c}&keys={fingerprint}" if link else c for c in codes]
    # The codes exist in clear only in this file (the issuer keeps hashes).
    create_file(out, ("\n".join(lines) + "\n").encode(), 0o600)
    print(f"minted {len(codes)} invitations into {out} (one per respondent, each usable once)")
    print(
        f"issuer keys fingerprint: {fingerprint} (publish it with the survey; the links carry"
        " it, and veil survey respond --issuer-keys checks it)"
    )
    return 0


def cmd_issuer(args: argparse.Namespace) -> int:
    import ssl

    from starlette.applications import Starlette
    from starlette.routing import Route

    from veil.grpc_util import bind_socket, is_loopback
    from veil.invite.http import PATH, endpoint
    from veil.invite.issuer import Issuer, IssuerError
    from veil.web import ServeLimits
    from veil.web.guard import serve, tls_context

    name = "veil survey issuer"
    setup_logging(args.log_level)
    if (args.tls_cert is None) != (args.tls_key is None):
        print(f"{name}: give both --tls-cert and --tls-key, or neither", file=sys.stderr)
        return 2
    if args.tls_cert is None and not is_loopback(args.listen):
        print(
            f"{name}: refusing plaintext HTTP on {args.listen}: give --tls-cert and --tls-key",
            file=sys.stderr,
        )
        return 2
    try:
        issuer = Issuer(issuer_dir(args.issuer_dir))
        tls = None if args.tls_cert is None else tls_context(args.tls_cert, args.tls_key)
        listener = bind_socket(args.listen)
    except (IssuerError, OSError, ssl.SSLError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    scheme = "https" if tls else "http"
    print(f"issuing on {scheme}://{args.listen}{PATH}")
    sys.stdout.flush()
    app = Starlette(routes=[Route(PATH, endpoint(issuer), methods=["POST"])])
    try:
        serve(app, listener, ServeLimits(), tls=tls, log_level=args.log_level.lower())
    finally:
        listener.close()
    return 0


def register(survey: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = survey.add_parser(
        "invite",
        help="mint one-time invitation codes for a survey with invitations",
        description=(
            "Mint N invitation codes (unguessable, URL-safe, one per line) into a new file"
            " readable by you only. The issuer stores only their hashes. With --link, each"
            " line is a link to the survey page carrying the code in its #fragment, which"
            " browsers never send to a server."
        ),
    )
    p.add_argument("deployment", help="the deployment directory (or its issuer/ directory)")
    p.add_argument("--count", type=int, required=True, help="how many invitations")
    p.add_argument("--out", required=True, help="new file for the codes or links")
    p.add_argument("--link", metavar="URL", help="write page links: URL#invitation=CODE")
    p.set_defaults(func=cmd_invite)

    p = survey.add_parser(
        "issuer",
        help="redeem invitations for respondents of `veil survey respond --invitation`",
        description=(
            "Serve the issuer alone (POST /invitation): respondents send an invitation code"
            " with one blinded token per question and get them signed, once per invitation."
            " `veil survey serve --issuer-dir` serves the same beside the page."
        ),
    )
    p.add_argument("--issuer-dir", required=True, help="the deployment's issuer/ directory")
    p.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    p.add_argument("--tls-cert", help="PEM certificate chain for HTTPS")
    p.add_argument("--tls-key", help="PEM key of --tls-cert")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_issuer)
