// Text answers (src/text.js) against the cases shared with the Python client,
// tests/fixtures/text_answers.json, and their use as a Poplar1 measurement.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Poplar1 } from '../src/poplar1.js';
import { TextAnswerError, encodeTextAnswer } from '../src/text.js';

const here = dirname(fileURLToPath(import.meta.url));
const fixture = JSON.parse(
  readFileSync(resolve(here, '..', '..', 'tests', 'fixtures', 'text_answers.json'), 'utf8'),
);
const hex = (bytes) => Buffer.from(bytes).toString('hex');

test('the shared fixture has accepted and refused cases of every kind', () => {
  const errors = new Set(fixture.cases.map((c) => c.error).filter(Boolean));
  assert.deepEqual([...errors].sort(), ['empty', 'invalid', 'nul', 'too_long']);
  assert.ok(fixture.cases.filter((c) => !c.error).length >= 10);
});

for (const c of fixture.cases) {
  test(`text answer: ${c.name}`, () => {
    const options = { maxBytes: c.max_bytes, caseSensitive: c.case_sensitive };
    if (c.error) {
      assert.throws(
        () => encodeTextAnswer(c.answer, options),
        (err) => err instanceof TextAnswerError && err.code === c.error && err.message.length > 0,
      );
      return;
    }
    const { text, bytes, measurement } = encodeTextAnswer(c.answer, options);
    assert.equal(text, c.normalized);
    assert.equal(hex(bytes), c.bytes);
    assert.equal(measurement.map((b) => (b ? '1' : '0')).join(''), c.bits);
  });
}

test('the refusal of a long answer says how long it is and the limit', () => {
  assert.throws(
    () => encodeTextAnswer('ü'.repeat(9), { maxBytes: 16 }),
    /too long: 18 bytes in UTF-8, at most 16/,
  );
});

test('bad options and non-string answers are refused', () => {
  for (const maxBytes of [0, -1, 1.5, 257, '16', undefined]) {
    assert.throws(() => encodeTextAnswer('a', { maxBytes }), RangeError, String(maxBytes));
  }
  assert.throws(() => encodeTextAnswer('a', { maxBytes: 16, bits: 127 }), /must be 8 \* max_bytes/);
  for (const answer of [null, undefined, 42, ['a'], { text: 'a' }]) {
    assert.throws(
      () => encodeTextAnswer(answer, { maxBytes: 16 }),
      (err) => err instanceof TextAnswerError && err.code === 'type',
    );
  }
});

test('an encoded answer is a Poplar1 measurement of the task bits', () => {
  const { measurement } = encodeTextAnswer(' Zoom ', { maxBytes: 16, bits: 128 });
  const vdaf = new Poplar1(128);
  const rand = globalThis.crypto.getRandomValues(new Uint8Array(vdaf.RAND_SIZE));
  const nonce = globalThis.crypto.getRandomValues(new Uint8Array(16));
  const { inputShares } = vdaf.shard(new Uint8Array(0), measurement, nonce, rand);
  assert.equal(inputShares.length, 2);
  // The first byte's bits are the tree's first eight levels: "z" = 0x7a.
  assert.deepEqual(measurement.slice(0, 8), [false, true, true, true, true, false, true, false]);
});
