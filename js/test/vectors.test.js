// Known-answer tests against the official draft-irtf-cfrg-vdaf vectors: every
// Prio3 and Poplar1 file's shard operations, byte for byte (public share and
// each input share), the IDPF's key generation (IdpfBBCGGI21_0) and the
// fixed-key AES XOF. The vectors are read from $VEIL_VDAF_VECTORS or from
// ../shared/vdaf-test-vectors beside the checkout, as the Python tests do.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { PolyEval } from '../src/gadgets.js';
import { Field64, Field128 } from '../src/field.js';
import { IdpfBBCGGI21 } from '../src/idpf.js';
import { Poplar1 } from '../src/poplar1.js';
import { XofFixedKeyAes128 } from '../src/xof.js';
import {
  Prio3,
  Prio3Count,
  Prio3Histogram,
  Prio3L1BoundSum,
  Prio3MultihotCountVec,
  Prio3Sum,
  Prio3SumVec,
  Prio3SumVecWithMultiproof,
} from '../src/prio3.js';

const here = dirname(fileURLToPath(import.meta.url));
// js/test -> js -> checkout -> its parent, where shared/ lives.
const DEFAULT_VECTORS = resolve(here, '..', '..', '..', 'shared', 'vdaf-test-vectors');

export function vectorsDir() {
  const dir = process.env.VEIL_VDAF_VECTORS || DEFAULT_VECTORS;
  return existsSync(dir) ? dir : null;
}

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));

/** The draft's test-only circuit with a degree-3 gadget x(x-1)(x-2). */
class HigherDegree {
  field = Field64;
  MEAS_LEN = 1;
  JOINT_RAND_LEN = 0;
  OUTPUT_LEN = 1;
  EVAL_OUTPUT_LEN = 1;
  GADGETS = [new PolyEval([0, 2, -3, 1])];
  GADGET_CALLS = [1];
  encode(measurement) {
    return [BigInt(measurement)];
  }
  eval(meas, jointRand, numShares, gadgets) {
    return [gadgets[0]([meas[0]])];
  }
}

function makeVdaf(name, tv) {
  const kind = name.includes('_bad_') ? name.split('_bad_')[0] : name.replace(/_\d+$/, '');
  const shares = tv.shares;
  switch (kind) {
    case 'Prio3Count':
      return new Prio3Count(shares);
    case 'Prio3Sum':
      return new Prio3Sum(shares, tv.max_measurement);
    case 'Prio3SumVec':
      return new Prio3SumVec(shares, tv.length, tv.max_measurement, tv.chunk_length);
    case 'Prio3Histogram':
      return new Prio3Histogram(shares, tv.length, tv.chunk_length);
    case 'Prio3MultihotCountVec':
      return new Prio3MultihotCountVec(shares, tv.length, tv.max_weight, tv.chunk_length);
    case 'Prio3L1BoundSum':
      return new Prio3L1BoundSum(shares, tv.length, tv.max_value, tv.chunk_length);
    case 'Prio3SumVecWithMultiproof':
      // Field and proof count are fixed by the draft's generator, not the JSON.
      return new Prio3SumVecWithMultiproof(
        shares, Field64, 3, tv.length, tv.max_measurement, tv.chunk_length,
      );
    case 'Prio3HigherDegree':
      return new Prio3(0xffffffff, shares, new HigherDegree(), 1);
    default:
      throw new Error(`unknown vector family ${kind}`);
  }
}

const dir = vectorsDir();
const files = dir ? readdirSync(dir).filter((f) => /^Prio3.*\.json$/.test(f)).sort() : [];
const poplarFiles = dir ? readdirSync(dir).filter((f) => /^Poplar1_.*\.json$/.test(f)).sort() : [];
// Added to the vectors directory after the Prio3 files (issue 27).
const REQUIRED_POPLAR = [
  ...[0, 1, 2, 3, 4, 5].map((i) => `Poplar1_${i}.json`),
  'IdpfBBCGGI21_0.json',
  'XofFixedKeyAes128.json',
];
const missingPoplar = dir ? REQUIRED_POPLAR.filter((f) => !existsSync(join(dir, f))) : REQUIRED_POPLAR;
const REQUIRED = [
  'Prio3Count',
  'Prio3Sum',
  'Prio3SumVec',
  'Prio3Histogram',
  'Prio3MultihotCountVec',
  'Prio3L1BoundSum',
];

test('the official vectors are present', { skip: dir ? false : skipReason() }, () => {
  for (const family of REQUIRED) {
    assert.ok(
      files.some((f) => f.startsWith(`${family}_`)),
      `no ${family} vector file in ${dir}`,
    );
  }
});

test(
  'the official Poplar1 and IDPF vectors are present',
  { skip: missingPoplar.length === 0 ? false : skipReason(`missing ${missingPoplar.join(', ')}`) },
  () => assert.ok(poplarFiles.length >= 6),
);

function skipReason(what = 'not found') {
  const reason =
    `official VDAF test vectors ${what}: set VEIL_VDAF_VECTORS or place test_vec/vdaf ` +
    'of the draft-irtf-cfrg-vdaf repository at ../shared/vdaf-test-vectors';
  // CI always has them: there a missing file is a failure, not a skip.
  if (process.env.CI) throw new Error(reason);
  return reason;
}

for (const file of files) {
  const tv = JSON.parse(readFileSync(join(dir, file), 'utf8'));
  // The _bad_ files tamper with what the aggregators receive: they have no
  // shard operation, so nothing in them concerns the client.
  const skip = tv.operations.some((op) => op.operation === 'shard')
    ? false
    : 'no shard operation (a verification-only vector)';
  test(`shard matches ${file}`, { skip }, () => {
    const vdaf = makeVdaf(file.replace(/\.json$/, ''), tv);
    const ctx = unhex(tv.ctx);
    let sharded = 0;
    for (const op of tv.operations) {
      if (op.operation !== 'shard') continue;
      const report = tv.reports[op.report_index ?? 0];
      const { publicShare, inputShares } = vdaf.shard(
        ctx, report.measurement, unhex(report.nonce), unhex(report.rand),
      );
      assert.equal(hex(vdaf.encodePublicShare(publicShare)), report.public_share);
      assert.deepEqual(
        inputShares.map((s) => hex(vdaf.encodeInputShare(s))),
        report.input_shares,
      );
      sharded += 1;
    }
    assert.ok(sharded > 0);
  });
}

for (const file of poplarFiles) {
  const tv = JSON.parse(readFileSync(join(dir, file), 'utf8'));
  // Poplar1_bad_corr_inner tampers with an input share: verification only.
  const skip = tv.operations.some((op) => op.operation === 'shard')
    ? false
    : 'no shard operation (a verification-only vector)';
  test(`shard matches ${file}`, { skip }, () => {
    const vdaf = new Poplar1(tv.bits);
    const ctx = unhex(tv.ctx);
    let sharded = 0;
    for (const op of tv.operations) {
      if (op.operation !== 'shard') continue;
      const report = tv.reports[op.report_index ?? 0];
      const { publicShare, inputShares } = vdaf.shard(
        ctx, report.measurement, unhex(report.nonce), unhex(report.rand),
      );
      assert.equal(hex(vdaf.encodePublicShare(publicShare)), report.public_share);
      assert.deepEqual(
        inputShares.map((s) => hex(vdaf.encodeInputShare(s))),
        report.input_shares,
      );
      sharded += 1;
    }
    assert.ok(sharded > 0);
  });
}

test('IDPF key generation matches IdpfBBCGGI21_0.json', { skip: dir ? false : skipReason() }, (t) => {
  const file = join(dir, 'IdpfBBCGGI21_0.json');
  if (!existsSync(file)) return t.skip('no IdpfBBCGGI21_0.json (reported above)');
  const tv = JSON.parse(readFileSync(file, 'utf8'));
  const idpf = new IdpfBBCGGI21(tv.beta_leaf.length, tv.bits);
  // The vector lists the keys; key generation draws them as its rand.
  const rand = unhex(tv.keys.join(''));
  const { publicShare, keys } = idpf.gen(
    tv.alpha,
    tv.beta_inner.map((beta) => beta.map(BigInt)),
    tv.beta_leaf.map(BigInt),
    unhex(tv.ctx),
    unhex(tv.nonce),
    rand,
  );
  assert.equal(hex(idpf.encodePublicShare(publicShare)), tv.public_share);
  assert.deepEqual(keys.map(hex), tv.keys);
});

test('XofFixedKeyAes128 matches XofFixedKeyAes128.json', { skip: dir ? false : skipReason() }, (t) => {
  const file = join(dir, 'XofFixedKeyAes128.json');
  if (!existsSync(file)) return t.skip('no XofFixedKeyAes128.json (reported above)');
  const tv = JSON.parse(readFileSync(file, 'utf8'));
  const [seed, dst, binder] = [unhex(tv.seed), unhex(tv.dst), unhex(tv.binder)];
  assert.equal(hex(XofFixedKeyAes128.deriveSeed(seed, dst, binder)), tv.derived_seed);
  const length = Number(tv.length);
  const whole = XofFixedKeyAes128.expandIntoVec(Field128, seed, dst, binder, length);
  assert.equal(hex(Field128.encodeVec(whole)), tv.expanded_vec_field128);
  // Read element by element with a key derived beforehand: the same stream.
  const xof = new XofFixedKeyAes128(seed, dst, binder, XofFixedKeyAes128.key(dst, binder));
  const pieces = Array.from({ length }, () => xof.nextVec(Field128, 1)[0]);
  assert.equal(hex(Field128.encodeVec(pieces)), tv.expanded_vec_field128);
  // Computed ahead for two seeds in one call (as the IDPF does), then read on
  // past the bytes computed ahead.
  const [ahead, other] = XofFixedKeyAes128.key(dst, binder).xofs([seed, seed.map((b) => b ^ 1)], 20);
  const read = [ahead.next(3), ahead.next(17), ahead.next(length * 16 - 20)];
  assert.equal(read.map(hex).join(''), tv.expanded_vec_field128);
  assert.notEqual(hex(other.next(16)), tv.derived_seed);
});
