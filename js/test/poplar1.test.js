// Poplar1's client half (src/idpf.js, src/poplar1.js) beyond the official
// vectors (vectors.test.js, which stop at 11 bits): the IDPF's point function
// at the 128 bits of a 16-byte answer, evaluated here as the aggregators will
// (the draft's eval_next, written for this test only), the fixed-key AES XOF
// against OpenSSL's AES at any block index, the share sizes, and the refusals
// of malformed arguments.

import assert from 'node:assert/strict';
import { createCipheriv } from 'node:crypto';
import { test } from 'node:test';

import { MeasurementError } from '../src/circuits.js';
import { Field64, Field255 } from '../src/field.js';
import { IdpfBBCGGI21 } from '../src/idpf.js';
import { Poplar1 } from '../src/poplar1.js';
import { XofFixedKeyAes128, XofTurboShake128 } from '../src/xof.js';
import { concat, formatDst } from '../src/prio3.js';

const randomBytes = (/** @type {number} */ n) => globalThis.crypto.getRandomValues(new Uint8Array(n));
const randomBits = (/** @type {number} */ n) => Array.from(randomBytes(n), (b) => (b & 1) === 1);
const ctx = new TextEncoder().encode('some application');

/**
 * One aggregator's share of the IDPF's value at `prefix` (the draft's eval
 * for a single prefix), from its key and the public share.
 */
function evalPrefix(idpf, aggId, publicShare, key, prefix, nonce) {
  const dst = (usage) => concat(formatDst(1, 0, usage), ctx);
  const xof = (level, usage, seed) =>
    level < idpf.BITS - 1
      ? new XofFixedKeyAes128(seed, dst(usage), nonce)
      : new XofTurboShake128(seed, dst(usage), nonce);
  let seed = key;
  let ctrl = aggId === 1;
  let y = [];
  for (let level = 0; level < prefix.length; level++) {
    const { seedCw, ctrlCw, wCw } = publicShare[level];
    const stream = xof(level, 0, seed).next(32);
    const s = [stream.slice(0, 16), stream.slice(16)];
    const t = [(s[0][0] & 1) === 1, (s[1][0] & 1) === 1];
    s[0][0] &= 0xfe;
    s[1][0] &= 0xfe;
    if (ctrl) {
      for (let i = 0; i < 16; i++) {
        s[0][i] ^= seedCw[i];
        s[1][i] ^= seedCw[i];
      }
      t[0] = t[0] !== ctrlCw[0];
      t[1] = t[1] !== ctrlCw[1];
    }
    const bit = prefix[level] ? 1 : 0;
    ctrl = t[bit];
    const field = idpf.currentField(level);
    const convert = xof(level, 1, s[bit]);
    seed = convert.next(16);
    y = convert.nextVec(field, idpf.VALUE_LEN);
    if (ctrl) y = field.vecAdd(y, wCw);
  }
  const field = idpf.currentField(prefix.length - 1);
  return aggId === 0 ? y : y.map((x) => field.neg(x));
}

test('the IDPF is beta on every prefix of alpha and zero off it, at 128 bits', () => {
  const bits = 128;
  const idpf = new IdpfBBCGGI21(2, bits);
  const alpha = randomBits(bits);
  const betaInner = Array.from({ length: bits - 1 }, (_, i) => [BigInt(i + 1), 7n * BigInt(i)]);
  const betaLeaf = [1n, Field255.MODULUS - 5n];
  const nonce = randomBytes(16);
  const { publicShare, keys } = idpf.gen(alpha, betaInner, betaLeaf, ctx, nonce, randomBytes(32));
  // On the path, at a few inner levels and the leaf; off the path, the same
  // levels with the last bit flipped.
  for (const level of [0, 1, 7, 63, 126, 127]) {
    const field = idpf.currentField(level);
    const beta = level < bits - 1 ? betaInner[level] : betaLeaf;
    const onPath = alpha.slice(0, level + 1);
    const offPath = [...onPath.slice(0, level), !onPath[level]];
    const sum = (prefix) =>
      field.vecAdd(
        evalPrefix(idpf, 0, publicShare, keys[0], prefix, nonce),
        evalPrefix(idpf, 1, publicShare, keys[1], prefix, nonce),
      );
    assert.deepEqual(sum(onPath), beta, `level ${level} on the path`);
    assert.deepEqual(sum(offPath), [0n, 0n], `level ${level} off the path`);
  }
});

test('XofFixedKeyAes128 blocks are those of OpenSSL AES-128, at any counter', () => {
  const key = XofFixedKeyAes128.key(ctx, randomBytes(16));
  const seeds = [randomBytes(16), randomBytes(16)];
  for (const first of [0, 255, 256, 2 ** 32 - 1, 2 ** 40 + 3, 2 ** 53 - 3]) {
    const got = key.blocks(seeds, first, 2);
    let at = 0;
    for (const seed of seeds) {
      for (let i = first; i < first + 2; i++, at += 16) {
        // seed XOR le128(i), counter bytes from a BigInt; sigma; AES; XOR.
        const x = seed.slice();
        for (let j = 0; j < 16; j++) x[j] ^= Number((BigInt(i) >> BigInt(8 * j)) & 0xffn);
        const sigma = Buffer.concat([x.subarray(8), x.subarray(8).map((b, j) => b ^ x[j])]);
        const aes = createCipheriv('aes-128-ecb', key._key, null).setAutoPadding(false);
        const block = Buffer.concat([aes.update(sigma), aes.final()]).map((b, j) => b ^ sigma[j]);
        assert.deepEqual(got.subarray(at, at + 16), new Uint8Array(block), `block ${i}`);
      }
    }
  }
});

test('a 16-byte answer shards into shares of the draft sizes', () => {
  const vdaf = new Poplar1(128);
  assert.equal(vdaf.RAND_SIZE, 128);
  const { publicShare, inputShares } = vdaf.shard(ctx, randomBits(128), randomBytes(16), randomBytes(128));
  // Packed control bits, seeds, Field64 pairs for 127 levels, a Field255 pair.
  assert.equal(vdaf.encodePublicShare(publicShare).length, 32 + 128 * 16 + 127 * 16 + 64);
  for (const share of inputShares) {
    assert.equal(vdaf.encodeInputShare(share).length, 16 + 32 + 127 * 16 + 64);
    assert.ok(share.corrInner.every((x) => x < Field64.MODULUS));
    assert.ok(share.corrLeaf.every((x) => x < Field255.MODULUS));
  }
  // Fresh randomness, other shares: nothing is fixed but the sizes.
  const again = vdaf.shard(ctx, randomBits(128), randomBytes(16), randomBytes(128));
  assert.notDeepEqual(vdaf.encodeInputShare(again.inputShares[0]), vdaf.encodeInputShare(inputShares[0]));
});

test('malformed measurements and argument sizes are refused', () => {
  const vdaf = new Poplar1(8);
  const nonce = randomBytes(16);
  const rand = randomBytes(vdaf.RAND_SIZE);
  const bits = randomBits(8);
  for (const bad of [bits.slice(1), [...bits, true], bits.map(Number), 'abc', null, {}]) {
    assert.throws(() => vdaf.shard(ctx, bad, nonce, rand), MeasurementError, JSON.stringify(bad));
  }
  assert.throws(() => vdaf.shard(ctx, bits, randomBytes(15), rand), /nonce must be 16 bytes/);
  assert.throws(() => vdaf.shard(ctx, bits, nonce, randomBytes(127)), /rand must be 128 bytes/);
  for (const badBits of [0, -1, 1.5, 65536, NaN]) {
    assert.throws(() => new Poplar1(badBits), RangeError, String(badBits));
  }
  assert.throws(() => new XofFixedKeyAes128(randomBytes(32), ctx, nonce), /seed must be 16 bytes/);
  const { inputShares } = vdaf.shard(ctx, bits, nonce, rand);
  const share = inputShares[0];
  for (const bad of [
    { ...share, key: share.key.subarray(1) },
    { ...share, corrSeed: randomBytes(16) },
    { ...share, corrInner: share.corrInner.slice(1) },
    { ...share, corrLeaf: [...share.corrLeaf, 0n] },
  ]) {
    assert.throws(() => vdaf.encodeInputShare(bad), RangeError);
  }
});
