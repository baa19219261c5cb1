"""veil's invitation tokens against an RFC 9578 implementation we did not
write: @cloudflare/privacypass-ts (js/ devDependency), whose token type
0x0002 is RSABSSA-SHA384-PSS-Deterministic with the key id taken over the
key's RSASSA-PSS SubjectPublicKeyInfo, as RFC 9578 section 6 says.

Both ways, for the challenge veil builds from a real sealed report
(issuer_name, the report's redemption_context, empty origin_info):
privacypass-ts accepts a token that veil's issuer signed and veil's client
finalised, and veil's verifier (the aggregators') accepts one that
privacypass-ts's client and issuer made. Each side also refuses the token
for another report's challenge, and with its signature altered."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.modes import unavailable
from tests.support.node import JS_DIR, require_node_client
from veil.client.prepare import prepare_reports
from veil.hpke import generate_keypair
from veil.invite import blindrsa
from veil.invite.issuer import Issuer, mint, write_keys
from veil.invite.token import (
    ISSUER_NAME,
    ORIGIN_INFO,
    TOKEN_TYPE,
    PendingToken,
    TokenError,
    Verifier,
    public_key_bytes,
    report_context,
    token_challenge,
)
from veil.task import DpSpec, VdafSpec, new_task

# Reads {"mode", ...} on stdin, answers JSON on stdout; bytes as hex.
SCRIPT = r"""
import { TokenChallenge, Token, publicVerif } from "@cloudflare/privacypass-ts";
const { BLIND_RSA, BlindRSAMode, Client, Issuer, Origin, getPublicKeyBytes } = publicVerif;
const input = JSON.parse(await new Promise((ok) => {
  let s = ""; process.stdin.on("data", (d) => (s += d)); process.stdin.on("end", () => ok(s));
}));
// Each array on an ArrayBuffer of its own: the library serializes `.buffer`.
const b = (h) => new Uint8Array(Buffer.from(h, "hex"));
const hex = (u) => Buffer.from(u).toString("hex");
const sha256 = async (u) => new Uint8Array(await crypto.subtle.digest("SHA-256", u));
const alg = { name: "RSA-PSS", hash: "SHA-384" };
const challenge = (context) => new TokenChallenge(
  BLIND_RSA.value, new TextDecoder().decode(b(input.issuer_name)), b(context),
  input.origin_info ? [new TextDecoder().decode(b(input.origin_info))] : undefined);
const out = { challenge: hex(challenge(input.context).serialize()) };
if (input.mode === "verify") {
  // A token made by veil: the library's parsing, challenge digest, key id and verifier.
  const pk = await crypto.subtle.importKey("spki", b(input.spki), alg, true, ["verify"]);
  const origin = new Origin(BlindRSAMode.PSS);
  const check = async (tokenHex, context) => {
    const token = Token.deserialize(BLIND_RSA, b(tokenHex));
    return {
      type: token.authInput.tokenType,
      digest:
        hex(token.authInput.challengeDigest) === hex(await sha256(challenge(context).serialize())),
      key_id: hex(token.authInput.tokenKeyId) === hex(await sha256(await getPublicKeyBytes(pk))),
      signature: await origin.verify(token, pk),
    };
  };
  out.token = await check(input.token, input.context);
  out.other_report = await check(input.token, input.other_context);
  out.altered = await check(input.altered, input.context);
} else {
  // A token made by the library's client and issuer for veil's challenge.
  const keys = await Issuer.generateKey(BlindRSAMode.PSS,
    { modulusLength: 2048, publicExponent: Uint8Array.from([1, 0, 1]) });
  const name = new TextDecoder().decode(b(input.issuer_name));
  const issuer = new Issuer(BlindRSAMode.PSS, name, keys.privateKey, keys.publicKey);
  const client = new Client(BlindRSAMode.PSS);
  const request = await client.createTokenRequest(
    challenge(input.context), await getPublicKeyBytes(keys.publicKey));
  const token = await client.finalize(await issuer.issue(request));
  out.token = hex(token.serialize());
  out.spki = hex(new Uint8Array(await crypto.subtle.exportKey("spki", keys.publicKey)));
}
console.log(JSON.stringify(out));
"""


def _node(data: dict[str, Any]) -> dict[str, Any]:
    node = require_node_client()
    if not (JS_DIR / "node_modules" / "@cloudflare" / "privacypass-ts").is_dir():
        unavailable("js/node_modules lacks @cloudflare/privacypass-ts: run `npm ci` in js/")
    done = subprocess.run(
        [node, "--input-type=module", "-e", SCRIPT],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        cwd=JS_DIR,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _contexts(der: bytes) -> tuple[bytes, bytes]:
    """The redemption contexts of two real sealed reports of one task."""
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1,
        dp=DpSpec("none"), issuer_public_key=der,
    )  # fmt: skip
    kp = generate_keypair(1)
    reports = prepare_reports(
        files.client, [1, 0], kp.config, kp.config, int(time.time()), invited=True
    )
    a, b = (report_context(files.client.task_id, r) for r in reports)
    return a, b


def _challenge_fields(context: bytes) -> dict[str, str]:
    return {
        "issuer_name": ISSUER_NAME.hex(),
        "origin_info": ORIGIN_INFO.hex(),
        "context": context.hex(),
    }


def test_rfc9578_privacypass_ts_accepts_a_token_from_veils_issuer(tmp_path: Path) -> None:
    key = blindrsa.generate_key()
    der = public_key_bytes(key.public_key())
    context, other = _contexts(der)
    write_keys(tmp_path, [key])
    (code,) = mint(tmp_path, 1)
    pending = PendingToken.start(der, context)  # veil's client, as `redeem` blinds
    (blind_sig,) = Issuer(tmp_path).redeem(code, [pending.blinded_msg])
    token = pending.finish(blind_sig)
    Verifier(der).check(token, context)
    altered = token[:-1] + bytes([token[-1] ^ 1])
    got = _node(
        {
            "mode": "verify",
            **_challenge_fields(context),
            "other_context": other.hex(),
            "spki": der.hex(),
            "token": token.hex(),
            "altered": altered.hex(),
        }
    )
    assert bytes.fromhex(got["challenge"]) == token_challenge(context)
    assert got["token"] == {"type": TOKEN_TYPE, "digest": True, "key_id": True, "signature": True}
    assert got["other_report"]["digest"] is False
    assert got["altered"]["signature"] is False


def test_rfc9578_veils_verifier_accepts_a_token_from_privacypass_ts() -> None:
    # The library generates its own issuer key; veil's challenge is built from
    # a report of a task under another key, which the context does not depend on.
    context, other = _contexts(public_key_bytes(blindrsa.generate_key().public_key()))
    got = _node({"mode": "issue", **_challenge_fields(context)})
    assert bytes.fromhex(got["challenge"]) == token_challenge(context)
    token, spki = bytes.fromhex(got["token"]), bytes.fromhex(got["spki"])
    verifier = Verifier(spki)
    verifier.check(token, context)
    with pytest.raises(TokenError, match="another report"):
        verifier.check(token, other)
    with pytest.raises(TokenError, match="does not verify"):
        verifier.check(token[:-1] + bytes([token[-1] ^ 1]), context)
    with pytest.raises(TokenError, match="another issuer key"):
        Verifier(public_key_bytes(blindrsa.generate_key().public_key())).check(token, context)
