// Free-text answers (issue 27): the one function that turns what a respondent
// typed into the string of bits Poplar1 counts. The Python client mirrors it;
// the cases both sides are tested against are tests/fixtures/text_answers.json.
//
// The normalisation, in this order:
//   1. Unicode NFC.
//   2. Trim: remove leading and trailing characters with the Unicode
//      White_Space property, exactly U+0009..U+000D, U+0020, U+0085, U+00A0,
//      U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 (not
//      the runtime's own trim: JavaScript's and Python's differ, on U+0085,
//      U+001C..U+001F and U+FEFF). Inner whitespace is kept as typed.
//   3. Unless case-sensitive: the Unicode default lower-casing (JavaScript's
//      toLowerCase, Python's str.lower: locale-free, full mappings, so "İ"
//      becomes "i" + U+0307 and a word-final "Σ" becomes "ς"), then NFC again
//      (lower-casing may undo NFC).
//   4. Refused (TextAnswerError, with `code`): an empty result ("empty"), a
//      lone surrogate ("invalid"), U+0000 ("nul": it would be confused with
//      the padding), more than maxBytes bytes of UTF-8 ("too_long"; counted
//      after normalisation).
// The encoding: the UTF-8 bytes, padded with zero bytes to maxBytes, each byte
// most significant bit first: 8 * maxBytes bits, the task's Poplar1 `bits`.
// So the IDPF tree's level 8k - 1 holds the answers' first k bytes, and the
// aggregators descend it byte by byte.
// NFC and lower-casing follow the runtime's Unicode tables (node 20: Unicode
// 17; Python 3.11: 14; browsers vary): for a character assigned after the
// older version the two sides may disagree, so that one answer typed on two
// devices counts as two strings. Every case in the fixture is Unicode <= 14.

import { MeasurementError } from './circuits.js';

/** Largest max_bytes accepted (2,048 bits: far beyond a short answer). */
export const MAX_TEXT_BYTES = 256;

const WHITE_SPACE = '\\u0009-\\u000d\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const TRIM = new RegExp(`^[${WHITE_SPACE}]+|[${WHITE_SPACE}]+$`, 'gu');
const LONE_SURROGATE = /\p{Surrogate}/u;

/** A text answer that cannot be counted; `code` names the rule it broke. */
export class TextAnswerError extends MeasurementError {
  /** @param {'empty'|'invalid'|'nul'|'too_long'|'type'} code @param {string} message */
  constructor(code, message) {
    super(message);
    this.name = 'TextAnswerError';
    this.code = code;
  }
}

/**
 * Normalise a text answer and encode it as a Poplar1 measurement.
 * @param {unknown} answer what the respondent typed
 * @param {{maxBytes: number, caseSensitive?: boolean, bits?: number}} options
 *   maxBytes: the question's max_bytes; bits, if given, the task's Poplar1
 *   bits, which must be 8 * maxBytes
 * @returns {{text: string, bytes: Uint8Array, measurement: boolean[]}} the
 *   normalised answer (to show what is counted), its padded UTF-8 bytes and
 *   their 8 * maxBytes bits
 */
export function encodeTextAnswer(answer, { maxBytes, caseSensitive = false, bits }) {
  if (!Number.isInteger(maxBytes) || maxBytes < 1 || maxBytes > MAX_TEXT_BYTES) {
    throw new RangeError(`max_bytes must be an integer in [1, ${MAX_TEXT_BYTES}], got ${maxBytes}`);
  }
  if (bits !== undefined && bits !== 8 * maxBytes) {
    throw new RangeError(`the task's bits (${bits}) must be 8 * max_bytes (${8 * maxBytes})`);
  }
  if (typeof answer !== 'string') {
    throw new TextAnswerError('type', 'a text answer must be a string');
  }
  if (LONE_SURROGATE.test(answer)) {
    throw new TextAnswerError('invalid', 'the answer is not valid Unicode text (a lone surrogate)');
  }
  let text = answer.normalize('NFC').replace(TRIM, '');
  if (!caseSensitive) text = text.toLowerCase().normalize('NFC');
  if (text.length === 0) {
    throw new TextAnswerError('empty', 'the answer is empty');
  }
  if (text.includes('\u0000')) {
    throw new TextAnswerError('nul', 'the answer contains a NUL character (U+0000)');
  }
  const utf8 = new TextEncoder().encode(text);
  if (utf8.length > maxBytes) {
    throw new TextAnswerError(
      'too_long',
      `the answer is too long: ${utf8.length} bytes in UTF-8, at most ${maxBytes} ` +
        '(a letter outside ASCII takes 2 to 4 bytes)',
    );
  }
  const bytes = new Uint8Array(maxBytes);
  bytes.set(utf8);
  const measurement = [];
  for (const byte of bytes) {
    for (let shift = 7; shift >= 0; shift--) measurement.push(((byte >> shift) & 1) === 1);
  }
  return { text, bytes, measurement };
}
