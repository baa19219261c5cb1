// Local randomized response (src/local.js) against veil.dp.local: the same exact
// odds as Python, each channel's frequencies against its exact law, and the
// refusals. The end-to-end test with real servers is tests/js/test_js_local.py.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { localChannel, localOdds, parseRational, randBelow } from '../src/local.js';

const randomBytes = (/** @type {number} */ n) => globalThis.crypto.getRandomValues(new Uint8Array(n));

test('odds are those of veil.dp.local.local_odds, digit for digit', () => {
  // From Python: local_odds(Fraction(e)) for each e.
  const python = {
    1: ['73786976294838206464', '27144711605075541099'],
    '1/2': ['4611686018427387904', '2797128963144291325'],
    20: ['9903520314283042199192993792', '20412676770678337121'],
    '1/1000': ['36893488147419103232', '36856613099868380069'],
    '3/2': ['147573952589676412928', '32928199675071288903'],
  };
  for (const [eps, [n, d]] of Object.entries(python)) {
    const odds = localOdds(parseRational(eps));
    assert.equal(odds.n.toString(), n, eps);
    assert.equal(odds.d.toString(), d, eps);
  }
  assert.deepEqual(parseRational('1.5'), parseRational('3/2'));
  assert.deepEqual(parseRational('1e-05'), parseRational('1/100000'));
  for (const bad of ['', 'x', '-1', '1/0', '1.2.3', null]) {
    assert.throws(() => parseRational(bad), RangeError, String(bad));
  }
});

test('randBelow is uniform', () => {
  const counts = [0, 0, 0, 0, 0];
  const n = 50_000;
  for (let i = 0; i < n; i++) counts[Number(randBelow(5n, randomBytes))]++;
  for (const c of counts) assert.ok(Math.abs(c - n / 5) < 5 * Math.sqrt((n * 4) / 25), String(counts));
});

/** Observed count within 5 standard deviations of n·p. */
function near(observed, n, p, what) {
  const sd = Math.sqrt(n * p * (1 - p));
  assert.ok(Math.abs(observed - n * p) < 5 * sd, `${what}: ${observed} vs ${n * p}`);
}

test('k-ary response keeps the answer with r/(r + k - 1)', () => {
  const channel = localChannel({ type: 'histogram', length: 4 }, { local_epsilon: '1' }, randomBytes);
  const n = 40_000;
  const counts = [0, 0, 0, 0];
  for (let i = 0; i < n; i++) counts[channel(2)]++;
  const keep = Math.E / (Math.E + 3);
  counts.forEach((c, j) => near(c, n, j === 2 ? keep : (1 - keep) / 3, `option ${j}`));
  const count = localChannel({ type: 'count' }, { local_epsilon: '2' }, randomBytes);
  let ones = 0;
  for (let i = 0; i < n; i++) ones += count(0);
  near(ones, n, 1 / (Math.exp(2) + 1), 'count');
});

test('multi-choice bits at ε/d and bounded sums at their exact law', () => {
  const vdaf = { type: 'multihot', length: 3, max_weight: 3, chunk_length: 2 };
  const channel = localChannel(vdaf, { local_epsilon: '2', local_max_choices: 1 }, randomBytes);
  const n = 20_000;
  const on = [0, 0, 0];
  for (let i = 0; i < n; i++) channel([false, true, false]).forEach((b, j) => (on[j] += b ? 1 : 0));
  const p = Math.E / (Math.E + 1); // each bit at ε/min(2·1, 3) = 1
  near(on[1], n, p, 'chosen bit');
  near(on[0], n, 1 - p, 'other bit');
  assert.throws(() => channel([true, true, false]), /at most 1 options/);
  assert.throws(
    () => localChannel({ ...vdaf, max_weight: 2 }, { local_epsilon: '1' }, randomBytes),
    /max_weight = length/,
  );
  const sum = localChannel({ type: 'sum', max_measurement: 10 }, { local_epsilon: '1' }, randomBytes);
  let high = 0;
  for (let i = 0; i < n; i++) {
    const out = sum(3);
    assert.ok(out === 0n || out === 10n);
    high += out === 10n ? 1 : 0;
  }
  near(high, n, (10 + 3 * (Math.E - 1)) / (10 * (Math.E + 1)), 'sum');
  const vec = localChannel(
    { type: 'sumvec', length: 2, max_measurement: 7, chunk_length: 2 },
    { local_epsilon: '2' },
    randomBytes,
  );
  assert.ok(vec([1, 7]).every((x) => x === 0n || x === 7n));
});

test('no local layer, or a bad one, is said plainly', () => {
  assert.equal(localChannel({ type: 'count' }, undefined, randomBytes), null);
  assert.equal(localChannel({ type: 'count' }, { mechanism: 'none' }, randomBytes), null);
  for (const bad of ['0', '1/2000', '21', 'abc']) {
    assert.throws(() => localChannel({ type: 'count' }, { local_epsilon: bad }, randomBytes), RangeError);
  }
});
