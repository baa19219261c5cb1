// The page's invitation tokens (src/invite.js) against an RFC 9578
// implementation we did not write, @cloudflare/privacypass-ts (a
// devDependency): its token type 0x0002 issuer signs what the page blinds,
// the page finalises, and the library parses the token and checks its
// challenge digest, its key id and its signature. The challenge is veil's:
// issuer_name issuer.veil.invalid, the redemption context of a sealed
// report, no origin_info. tests/js/test_js_rfc9578.py does the same with
// veil's Python issuer, client and verifier, both ways.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Token, TokenChallenge, publicVerif } from '@cloudflare/privacypass-ts';

import { finishInvitation, prepareInvitation, redemptionContext } from '../src/invite.js';

const { BLIND_RSA, BlindRSAMode, Issuer, Origin, TokenRequest, getPublicKeyBytes } = publicVerif;

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const b64 = (bytes) => Buffer.from(bytes).toString('base64url');
const unb64 = (text) => new Uint8Array(Buffer.from(text, 'base64url'));
const bytes = (n, fill) => new Uint8Array(n).fill(fill);
const sha256 = async (data) => new Uint8Array(await crypto.subtle.digest('SHA-256', data));

// A sealed report's parts as the page holds them (their content does not
// matter here, only that the context is computed from them).
const report = (fill) => ({
  report_id: bytes(16, fill),
  time: 1_800_000_000,
  public_share: bytes(40, fill + 1),
  leader_encrypted_input_share: { config_id: 1, enc: bytes(32, 2), payload: bytes(60, fill + 3) },
  helper_encrypted_input_share: { config_id: 2, enc: bytes(32, 4), payload: bytes(70, fill + 5) },
});

const challenge = (context) =>
  new TokenChallenge(BLIND_RSA.value, 'issuer.veil.invalid', new Uint8Array(context), undefined);

test('rfc9578: privacypass-ts issues the page tokens and verifies them', async () => {
  const keys = await Issuer.generateKey(BlindRSAMode.PSS, {
    modulusLength: 2048,
    publicExponent: Uint8Array.from([1, 0, 1]),
  });
  const issuer = new Issuer(BlindRSAMode.PSS, 'issuer.veil.invalid', keys.privateKey, keys.publicKey);
  const spki = new Uint8Array(await crypto.subtle.exportKey('spki', keys.publicKey));
  const taskId = bytes(32, 9);
  const task = { task_id: b64(taskId), issuer_public_key: b64(spki) };
  const mine = report(10);

  const pending = await prepareInvitation([task], [mine]);
  // The issuer's endpoint, played by the library's type 0x0002 issuer.
  const fetch = async (_url, init) => {
    const { blinded } = JSON.parse(init.body);
    const signatures = [];
    for (const blindedMsg of blinded) {
      const request = new TokenRequest(0, unb64(blindedMsg), BLIND_RSA);
      signatures.push(b64((await issuer.issue(request)).serialize()));
    }
    return { ok: true, status: 200, json: async () => ({ blind_signatures: signatures }) };
  };
  const [tokenBytes] = await finishInvitation('https://issuer.test/invitation', 'code', pending, {
    fetch,
  });

  const token = Token.deserialize(BLIND_RSA, new Uint8Array(tokenBytes));
  assert.equal(token.authInput.tokenType, 0x0002);
  const context = redemptionContext(taskId, mine);
  assert.equal(hex(token.authInput.challengeDigest), hex(await sha256(challenge(context).serialize())));
  assert.equal(hex(token.authInput.tokenKeyId), hex(await sha256(await getPublicKeyBytes(keys.publicKey))));
  const origin = new Origin(BlindRSAMode.PSS);
  assert.equal(await origin.verify(token, keys.publicKey), true);
  assert.equal(await issuer.verify(token), true);

  // Another report's challenge, and an altered signature, are not this token's.
  const other = redemptionContext(taskId, report(20));
  assert.notEqual(hex(token.authInput.challengeDigest), hex(await sha256(challenge(other).serialize())));
  const altered = new Uint8Array(tokenBytes);
  altered[altered.length - 1] ^= 1;
  assert.equal(await origin.verify(Token.deserialize(BLIND_RSA, altered), keys.publicKey), false);
});
