// What the survey page tells a respondent: the window in plain words, and
// failures without the server's wording (meant for programs) or report ids.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { statusMessage, windowMessage } from '../src/page.js';

const form = (opens, closes) =>
  /** @type {any} */ ({ dataset: { opens: String(opens), closes: String(closes) } });

test('before the window opens and after it closes the page says when', () => {
  const opens = Date.UTC(2026, 11, 1, 9, 0);
  const closes = Date.UTC(2026, 11, 15, 9, 0);
  const before = windowMessage(form(opens, closes), opens - 1);
  assert.match(before, /^This survey opens on .*2026.*\.$/);
  assert.match(before, /December|12/);
  assert.equal(windowMessage(form(opens, closes), opens), null);
  assert.equal(windowMessage(form(opens, closes), closes - 1), null);
  assert.match(windowMessage(form(opens, closes), closes), /^This survey closed on .*2026.*\.$/);
  // A page without a window (never rendered so) is open.
  assert.equal(windowMessage(/** @type {any} */ ({ dataset: {} }), opens), null);
});

test('every status gets a plain message, none with server wording', () => {
  const seen = new Set();
  for (const status of [400, 404, 409, 413, 415, 429, 500, 502, 503]) {
    const message = statusMessage(status);
    assert.ok(message.length > 20 && /[.]$/.test(message), message);
    assert.doesNotMatch(message, /leader|grpc|report id|[0-9]{3}/i, message);
    seen.add(message);
  }
  assert.ok(seen.size >= 4);
  assert.match(statusMessage(503), /Try again in a moment/);
  assert.match(statusMessage(409), /closed/);
});

test('a text answer is read, normalised and refused with a plain message', async () => {
  const { readAnswer } = await import('../src/page.js');
  const { encodeTextAnswer } = await import('../src/text.js');
  const q = /** @type {any} */ ({
    id: 'editor',
    kind: 'text',
    max_bytes: 4,
    case_sensitive: false,
    vdaf: { type: 'poplar1', bits: 32 },
  });
  const textForm = (value) =>
    /** @type {any} */ ({ querySelectorAll: () => [{ value, checked: false }] });
  assert.deepEqual(
    readAnswer(textForm('  Vim '), q),
    encodeTextAnswer('vim', { maxBytes: 4 }).measurement,
  );
  assert.equal(readAnswer(textForm('   '), q), null); // left out
  assert.throws(() => readAnswer(textForm('   '), { ...q, required: true }), /needs an answer/);
  assert.throws(() => readAnswer(textForm('Emacs'), q), /too long: at most 4 bytes/);
  assert.throws(() => readAnswer(textForm('a\u0000'), q), /cannot be sent as typed/);
});

test('a points answer is one whole number per option, at most the total in all', async () => {
  const { readAnswer, pointsAnswer, pointsTotalMessage } = await import('../src/page.js');
  const q = /** @type {any} */ ({ id: 'budget', kind: 'points', total: 100 });
  const pointsForm = (...values) =>
    /** @type {any} */ ({ querySelectorAll: () => values.map((value) => ({ value, checked: false })) });
  assert.deepEqual(readAnswer(pointsForm('40', ' 60 ', ''), q), [40, 60, 0]);
  assert.deepEqual(readAnswer(pointsForm('', '', '0'), q), [0, 0, 0]);
  assert.equal(readAnswer(pointsForm('', ' ', ''), q), null); // left out
  assert.throws(() => readAnswer(pointsForm('', '', ''), { ...q, required: true }), /needs an answer/);
  assert.throws(
    () => readAnswer(pointsForm('70', '40', ''), q),
    /add up to 110 points, over the 100 you have: take 10 off/,
  );
  for (const bad of ['-1', '1.5', 'ten', '1e3', '0x10', '9999999999999999']) {
    assert.throws(() => pointsAnswer([bad, '0'], 100), /whole number of points/, bad);
  }
  assert.deepEqual(pointsAnswer(['100', ''], 100), [100, 0]);
  assert.deepEqual(pointsTotalMessage(['40', '', '10'], 100), {
    text: '50 of 100 points given.',
    over: false,
  });
  assert.deepEqual(pointsTotalMessage(['90', '30'], 100), {
    text: '120 of 100 points given: 20 too many.',
    over: true,
  });
  assert.equal(pointsTotalMessage(['x'], 100).over, false);
  assert.match(pointsTotalMessage(['x'], 100).text, /whole numbers/);
});

test('a breakdown is answered from its two questions as the Python client answers it', async () => {
  const { breakdownMeasurement } = await import('../src/page.js');
  const questions = [
    { id: 'team', kind: 'choice', options: ['eng', 'design', 'sales'] },
    { id: 'remote', kind: 'yes_no' },
    { id: 'hours', kind: 'integer', max: 60 },
    { id: 'tools', kind: 'multi_choice', options: ['chat', 'wiki'], max_choices: 2 },
    { id: 'budget', kind: 'points', options: ['pay', 'tools'], total: 10 },
  ];
  const b = (question, by) => ({ id: `${question}_by_${by}`, question, by, task_id: 'x', vdaf: { type: '' } });
  // design, remote, 37 hours, wiki, 3 and 7 points: tests/survey/test_breakdown.py's answers.
  const answers = [1, 1, 37, [false, true], [3, 7]];
  assert.equal(breakdownMeasurement(b('remote', 'team'), questions, answers), 3);
  assert.deepEqual(breakdownMeasurement(b('hours', 'team'), questions, answers), [0, 37, 0]);
  assert.deepEqual(breakdownMeasurement(b('tools', 'remote'), questions, answers), [false, false, false, true]);
  assert.deepEqual(breakdownMeasurement(b('budget', 'remote'), questions, answers), [0, 0, 3, 7]);
  assert.equal(breakdownMeasurement(b('team', 'remote'), questions, answers), 4);
  // A question left out: no breakdown report.
  assert.equal(breakdownMeasurement(b('remote', 'team'), questions, [null, 1, 37, [], [0, 0]]), null);
  assert.equal(breakdownMeasurement(b('hours', 'team'), questions, [0, 1, null, [], [0, 0]]), null);
  assert.throws(() => breakdownMeasurement(b('ghost', 'team'), questions, answers), /no such questions/);
});

test('a breakdown of a randomized multiple choice or number sends its bits and a count', async () => {
  const { breakdownMeasurement } = await import('../src/page.js');
  const local = { local_epsilon: '2' };
  const questions = [
    { id: 'team', kind: 'choice', options: ['eng', 'design', 'sales'] },
    { id: 'hours', kind: 'integer', max: 60, dp: local },
    { id: 'tools', kind: 'multi_choice', options: ['chat', 'wiki'], max_choices: 2, dp: local },
  ];
  const b = (question, by) => ({ id: `${question}_by_${by}`, question, by, task_id: 'x', vdaf: { type: '' } });
  // The randomized answers as drawn (a number as its max or 0): as
  // tests/survey/test_breakdown.py's randomized breakdowns.
  const hours = [false, false, false, false, true, true];
  assert.deepEqual(breakdownMeasurement(b('hours', 'team'), questions, [1, 60, [true, false]]), [...hours.slice(0, 2), true, true, false, false]);
  assert.deepEqual(breakdownMeasurement(b('hours', 'team'), questions, [2, 0, [true, false]]), [false, false, false, false, false, true]);
  assert.deepEqual(
    breakdownMeasurement(b('tools', 'team'), questions, [0, 0, [true, false]]),
    [true, false, true, false, false, false, false, false, false],
  );
});
