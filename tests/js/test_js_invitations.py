"""The JavaScript client answers a survey with invitations (js/src/invite.js
with @cloudflare/blindrsa-ts): it redeems an invitation at a real `veil
survey issuer`, and the reports it seals with their tokens are accepted by
the real leader and aggregated by the real helper; the same invitation again
is refused with the issuer's message."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.deployment import start_deployment
from tests.support.node import JS_DIR, config_json, report_from_json, require_node_client, task_json
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.invite import blindrsa
from veil.invite.issuer import USED_MESSAGE, mint, write_keys
from veil.invite.token import public_key_bytes
from veil.local.launcher import free_port
from veil.task import DpSpec, VdafSpec, b64e

pytestmark = pytest.mark.slow

TP = 3600


def test_js_client_redeems_and_its_reports_pass_both_aggregators(tmp_path: Path) -> None:
    node = require_node_client()
    keys = [blindrsa.generate_key() for _ in range(2)]
    kw = {"time_precision": TP, "min_batch_size": 1}
    specs = {
        "yes": (VdafSpec("count"), DpSpec("none"), 1),
        "team": (VdafSpec("histogram", length=3, chunk_length=2), DpSpec("none"), 2),
    }
    dep = start_deployment(
        tmp_path / "dep",
        {
            name: (vdaf, dp, {**kw, "issuer_public_key": public_key_bytes(k.public_key())})
            for (name, (vdaf, dp, _)), k in zip(specs.items(), keys, strict=True)
        },
    )
    issuer_dir = tmp_path / "issuer"
    issuer_dir.mkdir()
    write_keys(issuer_dir, keys)
    (code,) = mint(issuer_dir, 1)
    port = free_port()
    issuer = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(issuer_dir),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert issuer.stdout is not None and "issuing on" in issuer.stdout.readline()
        questions = []
        for name, (_, _, measurement) in specs.items():
            task = dep.tasks[name].client
            client = dep.client(name)
            assert task.issuer_public_key is not None
            questions.append(
                {
                    "task": {**task_json(task), "issuer_public_key": b64e(task.issuer_public_key)},
                    "leader": config_json(client.hpke_config(2)),
                    "helper": config_json(client.hpke_config(3)),
                    "measurement": measurement,
                }
            )
        request = {
            "issuer": f"http://127.0.0.1:{port}/invitation",
            "invitation": code,
            "time": int(time.time()),
            "questions": questions,
        }

        def run() -> list[dict[str, object]]:
            done = subprocess.run(
                [node, str(JS_DIR / "scripts" / "invited-reports.mjs")],
                input=json.dumps(request).encode(),
                capture_output=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr.decode()
            return [json.loads(line) for line in done.stdout.decode().splitlines()]

        lines = run()
        assert len(lines) == 2
        for name, line in zip(specs, lines, strict=True):
            report = report_from_json(line["report"])  # type: ignore[arg-type]
            assert len(report.token) == 354
            assert dep.client(name).upload_reports([report]).accepted == 1
        assert run() == [{"error": USED_MESSAGE}]
        deadline = time.monotonic() + 60
        for name in specs:
            tid = dep.tasks[name].client.task_id
            while time.monotonic() < deadline:
                store = SqliteDatastore(dep.local.root / "helper.db")
                try:
                    done_ids = store.seen_reports(tid, [report_id(lines, name, specs)])
                finally:
                    store.close()
                if done_ids:
                    break
                time.sleep(0.2)
            assert dep.rejections("helper", name) == {}
            assert dep.rejections("leader", name) == {}
    finally:
        issuer.terminate()
        issuer.wait(timeout=20)
        if issuer.stdout is not None:
            issuer.stdout.close()
        dep.stop()


def report_id(lines: list[dict[str, object]], name: str, specs: dict[str, object]) -> bytes:
    index = list(specs).index(name)
    return report_from_json(lines[index]["report"]).report_id  # type: ignore[arg-type]


def test_js_and_python_agree_on_the_issuer_keys_fingerprint() -> None:
    """The page's fingerprint (js/src/invite.js) is the one veil survey
    deploy and veil survey invite print (veil.invite.token.keys_fingerprint),
    and its check refuses any other, in any spelling."""
    node = require_node_client()
    from veil.invite.token import keys_fingerprint

    spkis = [public_key_bytes(blindrsa.generate_key().public_key()) for _ in range(3)]
    published = keys_fingerprint(spkis)
    script = r"""
    import { checkIssuerKeys, keysFingerprint } from './src/invite.js';
    const input = JSON.parse(process.argv[1]);
    const questions = input.keys.map((k) => ({ issuer_public_key: k }));
    const spkis = input.keys.map((k) => Buffer.from(k, 'base64url'));
    const out = { fingerprint: keysFingerprint(spkis) };
    out.spelled = checkIssuerKeys(questions, input.spelled);
    out.unchecked = checkIssuerKeys(questions, null);
    try { checkIssuerKeys(questions, input.other); } catch (e) { out.refused = e.message; }
    try {
      checkIssuerKeys(questions.slice(1), input.published);
    } catch (e) {
      out.fewer = e.message;
    }
    console.log(JSON.stringify(out));
    """
    spelled = ":".join(published[i : i + 2] for i in range(0, 64, 2)).upper()
    arg = json.dumps(
        {
            "keys": [b64e(k) for k in spkis],
            "published": published,
            "spelled": spelled,
            "other": "0" * 64,
        }
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", script, arg],
        capture_output=True,
        text=True,
        cwd=JS_DIR,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["fingerprint"] == out["spelled"] == out["unchecked"] == published
    assert (
        f"(fingerprint {published}) are not the ones your link names ({'0' * 64})"
        in (out["refused"])
    )
    assert "are not the ones your link names" in out["fewer"]


def test_js_and_python_agree_on_rfc9578_key_ids_and_challenges() -> None:
    """js/src/invite.js computes RFC 9578's token_key_id (the key's RSASSA-PSS
    SPKI hashed), a sealed report's redemption context and the TokenChallenge
    digest as veil.invite.token does."""
    node = require_node_client()
    import secrets

    from veil.invite.token import challenge_digest, key_id, report_context
    from veil.messages import Ciphertext, Report

    spkis = [public_key_bytes(blindrsa.generate_key().public_key()) for _ in range(2)]
    task_id = secrets.token_bytes(32)
    report = Report(
        secrets.token_bytes(16),
        2**40 + 7,
        secrets.token_bytes(48),
        Ciphertext(7, secrets.token_bytes(32), secrets.token_bytes(60)),
        Ciphertext(200, secrets.token_bytes(32), secrets.token_bytes(50)),
    )
    script = r"""
    import { challengeDigest, redemptionContext, tokenKeyId } from './src/invite.js';
    const input = JSON.parse(process.argv[1]);
    const b = (t) => new Uint8Array(Buffer.from(t, 'base64url'));
    const t = (u) => Buffer.from(u).toString('base64url');
    const ct = (c) => ({ config_id: c.config_id, enc: b(c.enc), payload: b(c.payload) });
    const r = input.report;
    const report = {
      report_id: b(r.report_id), time: r.time, public_share: b(r.public_share),
      leader_encrypted_input_share: ct(r.leader), helper_encrypted_input_share: ct(r.helper),
    };
    const context = redemptionContext(b(input.task_id), report);
    console.log(JSON.stringify({
      key_ids: input.keys.map((k) => t(tokenKeyId(b(k)))),
      context: t(context),
      digest: t(challengeDigest(context)),
    }));
    """

    def ct(c: Ciphertext) -> dict[str, object]:
        return {"config_id": c.config_id, "enc": b64e(c.enc), "payload": b64e(c.payload)}

    arg = json.dumps(
        {
            "keys": [b64e(k) for k in spkis],
            "task_id": b64e(task_id),
            "report": {
                "report_id": b64e(report.report_id),
                "time": report.time,
                "public_share": b64e(report.public_share),
                "leader": ct(report.leader_ct),
                "helper": ct(report.helper_ct),
            },
        }
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", script, arg],
        capture_output=True,
        text=True,
        cwd=JS_DIR,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["key_ids"] == [b64e(key_id(k)) for k in spkis]
    context = report_context(task_id, report)
    assert out["context"] == b64e(context)
    assert out["digest"] == b64e(challenge_digest(context))
