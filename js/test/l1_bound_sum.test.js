// Prio3L1BoundSum's circuit (draft-ietf-ppm-l1-bound-sum-02) on the client:
// what it refuses, with the Python client's words, and that its validity
// check is zero on honest encodings and not on lies (the official vector, in
// vectors.test.js, fixes the shard's bytes but not the check's output, which
// the proof does not carry).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Field128 } from '../src/field.js';
import { L1BoundSum, MeasurementError, encodeRangeCheckedInt } from '../src/circuits.js';
import { Prio3L1BoundSum, prio3FromSpec } from '../src/prio3.js';

/** The circuit's check with its real gadgets, on a whole encoding. */
function check(circuit, meas, jointRand) {
  const calls = circuit.GADGETS.map((g) => (inp) => g.eval(circuit.field, inp));
  return circuit.eval(meas, jointRand, 1, calls);
}

const bits = (values, max) => values.flatMap((v) => encodeRangeCheckedInt(BigInt(v), BigInt(max)));

test('honest encodings pass the check and lies do not', () => {
  const circuit = new L1BoundSum(Field128, 3, 6, 4);
  const jointRand = [5n, 7n, 11n];
  assert.equal(circuit.MEAS_LEN, 12);
  for (const m of [[0, 0, 0], [6, 0, 0], [1, 2, 3], [0, 5, 1]]) {
    assert.deepEqual(check(circuit, circuit.encode(m), jointRand), [0n, 0n], String(m));
  }
  const p = Field128.MODULUS;
  for (const [name, lie] of [
    ['sum over the bound, claimed within it', bits([6, 6, 0, 6], 6)],
    ['claimed sum below the entries\'', bits([1, 2, 0, 2], 6)],
    ['a negative entry offsetting another', [p - 1n, 0n, 0n, ...bits([6, 0, 5], 6)]],
    ['a bit of 2', [2n, 0n, 0n, ...bits([0, 0, 2], 6)]],
  ]) {
    assert.notDeepEqual(check(circuit, lie, jointRand), [0n, 0n], name);
  }
});

test('bad measurements are refused with the Python client\'s words', () => {
  const vdaf = prio3FromSpec({ type: 'l1boundsum', length: 4, max_value: 120, chunk_length: 3 });
  assert.ok(vdaf instanceof Prio3L1BoundSum);
  assert.equal(vdaf.ID, 7);
  for (const [bad, message] of [
    [[60, 60, 0, 1], 'L1BoundSum measurement sums to 121; at most max_value=120'],
    [[0, 121, 0, 0], 'L1BoundSum measurement[1] must be in [0, 120], got 121'],
    [[0, 0, -1, 1], 'L1BoundSum measurement[2] must be in [0, 120], got -1'],
    [[1, true, 0, 0], 'L1BoundSum measurement[1] must be an int, not bool'],
    [[1, 2.5, 0, 0], 'L1BoundSum measurement[1] must be an int, not float'],
    [[1, 2, 3], 'L1BoundSum measurement must have exactly 4 entries, got 3'],
    ['1234', 'L1BoundSum measurement must be a sequence of 4 entries'],
  ]) {
    assert.throws(
      () => vdaf.shard(new Uint8Array(0), bad, new Uint8Array(16), new Uint8Array(vdaf.RAND_SIZE)),
      (e) => e instanceof MeasurementError && e.message === message,
    );
  }
  for (const params of [[0, 5, 2], [3, 0, 2], [3, 5, 0], [2 ** 40, 2n ** 100n, 2]]) {
    assert.throws(() => new Prio3L1BoundSum(2, ...params), MeasurementError);
  }
});
