// The page's blind RSA (tokenSuite() of src/invite.js, @cloudflare/blindrsa-ts)
// against RFC 9474's own test vector for the variant of veil's tokens (RFC
// 9578's token type 0x0002), RSABSSA-SHA384-PSS-Deterministic (Appendix A;
// an RSA-4096 key): blind with the vector's salt and r = inv^-1 mod n,
// finalize and verify, each giving the vector's bytes. The library draws the salt and r from
// crypto.getRandomValues, so the test hands it the vector's for one call.
// The vectors are read from $VEIL_RFC9474_VECTORS (a directory holding
// rfc9474.json) or ../shared/rfc9474-test-vectors beside the checkout, as
// tests/invite/test_rfc9474_vectors.py does.

import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { tokenSuite } from '../src/invite.js';
import { concat } from '../src/prio3.js';

const here = dirname(fileURLToPath(import.meta.url));
const dir =
  process.env.VEIL_RFC9474_VECTORS || resolve(here, '..', '..', '..', 'shared', 'rfc9474-test-vectors');
const file = join(dir, 'rfc9474.json');
const present = existsSync(file);

function skipReason() {
  const reason =
    'RFC 9474 test vectors not found: set VEIL_RFC9474_VECTORS to a directory holding ' +
    'rfc9474.json, or place it at ../shared/rfc9474-test-vectors';
  if (process.env.CI) throw new Error(reason);
  return reason;
}

const vector = present
  ? JSON.parse(readFileSync(file, 'utf8')).find((v) => v.name === 'RSABSSA-SHA384-PSS-Deterministic')
  : null;

const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));
const hex = (bytes) => Buffer.from(bytes).toString('hex');
const big = (text) => BigInt('0x' + text);
const b64url = (n) => {
  let h = n.toString(16);
  if (h.length % 2) h = '0' + h;
  return Buffer.from(h, 'hex').toString('base64url');
};

function modInverse(a, n) {
  let [r0, r1, s0, s1] = [n, a % n, 0n, 1n];
  while (r1 !== 0n) {
    const q = r0 / r1;
    [r0, r1] = [r1, r0 - q * r1];
    [s0, s1] = [s1, s0 - q * s1];
  }
  assert.equal(r0, 1n);
  return ((s0 % n) + n) % n;
}

function publicKey(v) {
  const jwk = { kty: 'RSA', n: b64url(big(v.n)), e: b64url(big(v.e)), ext: true };
  return crypto.subtle.importKey('jwk', jwk, { name: 'RSA-PSS', hash: 'SHA-384' }, true, [
    'verify',
  ]);
}

function privateKey(v) {
  const [p, q, d] = [big(v.p), big(v.q), big(v.d)];
  const jwk = {
    kty: 'RSA',
    n: b64url(big(v.n)),
    e: b64url(big(v.e)),
    d: b64url(d),
    p: b64url(p),
    q: b64url(q),
    dp: b64url(d % (p - 1n)),
    dq: b64url(d % (q - 1n)),
    qi: b64url(modInverse(q, p)),
    ext: true,
  };
  return crypto.subtle.importKey('jwk', jwk, { name: 'RSA-PSS', hash: 'SHA-384' }, true, [
    'sign',
  ]);
}

/** Runs `f` with crypto.getRandomValues answering `draws` in order. */
async function withRandomness(draws, f) {
  const original = crypto.getRandomValues;
  const queue = [...draws];
  crypto.getRandomValues = (array) => {
    const next = queue.shift();
    assert.ok(next, 'the library drew more randomness than the vector gives');
    assert.equal(next.length, array.length, 'a draw of another length than the vector gives');
    array.set(next);
    return array;
  };
  try {
    const out = await f();
    assert.equal(queue.length, 0, 'the library drew less randomness than the vector gives');
    return out;
  } finally {
    crypto.getRandomValues = original;
  }
}

const skip = present ? false : skipReason();

test('rfc9474: the page suite is RSABSSA-SHA384-PSS-Deterministic', () => {
  assert.equal(tokenSuite().toString(), 'RSABSSA-SHA384-PSS-Deterministic');
});

test('rfc9474: the page blinds the vector with its salt and r', { skip }, async () => {
  const v = vector;
  const pk = await publicKey(v);
  const n = big(v.n);
  const r = modInverse(big(v.inv), n);
  const rBytes = unhex(r.toString(16).padStart(1024, '0'));
  const suite = tokenSuite();
  // The deterministic variant prepares nothing: the message is signed as it is.
  assert.equal(v.msg_prefix, '');
  const prepared = unhex(v.msg);
  assert.equal(hex(prepared), v.prepared_msg);
  const { blindedMsg, inv } = await withRandomness([unhex(v.salt), rBytes], () =>
    suite.blind(pk, prepared),
  );
  assert.equal(hex(blindedMsg), v.blinded_msg);
  assert.equal(hex(inv), v.inv);
});

test('rfc9474: the page finalizes and verifies the vector', { skip }, async () => {
  const v = vector;
  const pk = await publicKey(v);
  const suite = tokenSuite();
  const sig = await suite.finalize(pk, unhex(v.prepared_msg), unhex(v.blind_sig), unhex(v.inv));
  assert.equal(hex(sig), v.sig);
  assert.equal(await suite.verify(pk, unhex(v.sig), unhex(v.prepared_msg)), true);
  assert.equal(await suite.verify(pk, unhex(v.sig), concat(unhex(v.msg), new Uint8Array([0]))), false);
  const spoiled = unhex(v.blind_sig);
  spoiled[spoiled.length - 1] ^= 1;
  await assert.rejects(
    suite.finalize(pk, unhex(v.prepared_msg), spoiled, unhex(v.inv)),
    /invalid signature/,
  );
  await assert.rejects(
    suite.finalize(pk, unhex(v.prepared_msg), unhex(v.blind_sig).slice(1), unhex(v.inv)),
    /unexpected input size/,
  );
});

test('rfc9474: the library blind-signs the vector as veil\'s issuer does', { skip }, async () => {
  const v = vector;
  const blindSig = await tokenSuite().blindSign(await privateKey(v), unhex(v.blinded_msg));
  assert.equal(hex(blindSig), v.blind_sig);
});
