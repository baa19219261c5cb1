"""veil's Python blind RSA (veil.invite) against @cloudflare/blindrsa-ts, the
library the browser page uses: a message blinded by one is signed and
finalised by the other, each result checked by both."""

from __future__ import annotations

import json
import subprocess

from cryptography.hazmat.primitives import serialization

from tests.support.node import JS_DIR, require_node_client
from veil.invite import blindrsa
from veil.task import b64d, b64e

SCRIPT = r"""
import { RSABSSA } from "@cloudflare/blindrsa-ts";
const input = JSON.parse(await new Promise((ok) => {
  let s = ""; process.stdin.on("data", (d) => (s += d)); process.stdin.on("end", () => ok(s));
}));
const b = (t) => Uint8Array.from(Buffer.from(t, "base64"));
const t = (u) => Buffer.from(u).toString("base64");
const suite = RSABSSA.SHA384.PSS.Randomized();
const alg = { name: "RSA-PSS", hash: "SHA-384" };
const pk = await crypto.subtle.importKey("spki", b(input.spki), alg, true, ["verify"]);
const out = {};
// 1. JS blinds, Python signs (next step), JS finalizes.
const msg = suite.prepare(b(input.msg));
const { blindedMsg, inv } = await suite.blind(pk, msg);
out.prepared = t(msg); out.blinded = t(blindedMsg); out.inv = t(inv);
if (input.blind_sig) {
  out.sig = t(await suite.finalize(pk, b(input.prepared), b(input.blind_sig), b(input.inv)));
}
// 2. JS signs what Python blinded; JS verifies Python's final signature.
if (input.pkcs8) {
  const sk = await crypto.subtle.importKey("pkcs8", b(input.pkcs8), alg, true, ["sign"]);
  out.js_blind_sig = t(await suite.blindSign(sk, b(input.py_blinded)));
}
if (input.py_sig) {
  out.js_verifies = await suite.verify(pk, b(input.py_sig), b(input.py_prepared));
}
console.log(JSON.stringify(out));
"""


def _node(node: str, data: dict[str, object]) -> dict[str, str]:
    out = subprocess.run(
        [node, "--input-type=module", "-e", SCRIPT],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        cwd=JS_DIR,
        timeout=60,
        check=True,
    )
    result: dict[str, str] = json.loads(out.stdout)
    return result


def test_python_and_javascript_blind_rsa_interoperate() -> None:
    node = require_node_client()
    sk = blindrsa.generate_key()
    pk = sk.public_key()
    spki = pk.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pkcs8 = sk.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    signer = blindrsa.Signer(sk)
    base = {"spki": b64e(spki), "msg": b64e(b"a token input")}

    # JavaScript blinds; Python blind-signs; JavaScript finalizes; Python verifies.
    first = _node(node, base)
    blind_sig = signer.blind_sign(b64d(first["blinded"]))
    done = _node(
        node,
        {**base, "prepared": first["prepared"], "inv": first["inv"], "blind_sig": b64e(blind_sig)},
    )
    prepared = b64d(first["prepared"])
    assert prepared.endswith(b"a token input") and len(prepared) == 32 + len(b"a token input")
    assert blindrsa.verify(pk, prepared, b64d(done["sig"]))

    # Python blinds; JavaScript blind-signs; Python finalizes; JavaScript verifies.
    py_prepared = blindrsa.prepare(b"another input")
    b = blindrsa.blind(pk, py_prepared)
    js = _node(node, {**base, "pkcs8": b64e(pkcs8), "py_blinded": b64e(b.blinded_msg)})
    sig = blindrsa.finalize(pk, py_prepared, b64d(js["js_blind_sig"]), b.inv)
    # Both signers compute the same function of the blinded message.
    assert b64d(js["js_blind_sig"]) == signer.blind_sign(b.blinded_msg)
    check = _node(node, {**base, "py_sig": b64e(sig), "py_prepared": b64e(py_prepared)})
    assert check["js_verifies"] is True
    bad = _node(node, {**base, "py_sig": b64e(sig), "py_prepared": b64e(py_prepared + b"!")})
    assert bad["js_verifies"] is False
