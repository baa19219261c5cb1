// Known-answer tests against the official draft-irtf-cfrg-vdaf vectors: every
// Prio3 file's shard operations, byte for byte (public share and each input
// share). The vectors are read from $VEIL_VDAF_VECTORS or from
// ../shared/vdaf-test-vectors beside the checkout, as the Python tests do.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { PolyEval } from '../src/gadgets.js';
import { Field64 } from '../src/field.js';
import {
  Prio3,
  Prio3Count,
  Prio3Histogram,
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
const REQUIRED = ['Prio3Count', 'Prio3Sum', 'Prio3SumVec', 'Prio3Histogram', 'Prio3MultihotCountVec'];

test('the official vectors are present', { skip: dir ? false : skipReason() }, () => {
  for (const family of REQUIRED) {
    assert.ok(
      files.some((f) => f.startsWith(`${family}_`)),
      `no ${family} vector file in ${dir}`,
    );
  }
});

function skipReason() {
  const reason =
    'official VDAF test vectors not found: set VEIL_VDAF_VECTORS or place test_vec/vdaf ' +
    'of the draft-irtf-cfrg-vdaf repository at ../shared/vdaf-test-vectors';
  // CI always has them: there a missing directory is a failure, not a skip.
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
