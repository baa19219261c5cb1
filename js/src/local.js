// Local randomized response (veil.dp.local): a task with `local_epsilon` in its
// [dp] table has every client randomize its measurement on the respondent's
// device before sharding, so the answer stays ε_L-private even if both
// aggregators collude. The randomized answer is a valid measurement of the same
// Prio3 type.
//
// The channels, their parameters and their exact probabilities are those of
// veil.dp.local, read side by side:
// - count, histogram: k-ary response, keep with r/(r + k - 1), else a uniform other;
// - multihot: binary response on each bit at ε_L/d, d = min(2·max_choices, length);
// - sum: report M with probability (M + x(r - 1))/(M(r + 1)), else 0;
// - sumvec: that on each coordinate at ε_L/length.
// r = localOdds(ε) is the same rational lower bound of e^ε as Python's (the same
// Taylor bounds in BigInt arithmetic), and each draw is one uniform BigInt below
// an integer total compared with an integer threshold: no floating point.

import { MeasurementError } from './circuits.js';

const ODDS_BITS = 64n;
const MAX_EPSILON = { n: 20n, d: 1n };
const MIN_EPSILON = { n: 1n, d: 1000n }; // of a whole answer, as in veil.dp.local

/** @typedef {{n: bigint, d: bigint}} Rational  d > 0, in lowest terms */

/** @param {bigint} a @param {bigint} b */
function gcd(a, b) {
  a = a < 0n ? -a : a;
  b = b < 0n ? -b : b;
  while (b) [a, b] = [b, a % b];
  return a;
}

/** @param {bigint} n @param {bigint} d @returns {Rational} */
function rat(n, d = 1n) {
  if (d === 0n) throw new RangeError('division by zero');
  if (d < 0n) [n, d] = [-n, -d];
  const g = gcd(n, d) || 1n;
  return { n: n / g, d: d / g };
}

const add = (/** @type {Rational} */ a, /** @type {Rational} */ b) => rat(a.n * b.d + b.n * a.d, a.d * b.d);
const sub = (/** @type {Rational} */ a, /** @type {Rational} */ b) => rat(a.n * b.d - b.n * a.d, a.d * b.d);
const mul = (/** @type {Rational} */ a, /** @type {Rational} */ b) => rat(a.n * b.n, a.d * b.d);
const div = (/** @type {Rational} */ a, /** @type {Rational} */ b) => rat(a.n * b.d, a.d * b.n);
const cmp = (/** @type {Rational} */ a, /** @type {Rational} */ b) => {
  const x = a.n * b.d - b.n * a.d;
  return x < 0n ? -1 : x > 0n ? 1 : 0;
};

/**
 * An exact rational from its text as veil writes it in task files: "2", "3/2",
 * "1.5", "1e-05" (Python's Fraction syntax, without signs or spaces).
 * @param {unknown} text
 * @returns {Rational}
 */
export function parseRational(text) {
  if (typeof text === 'number' && Number.isSafeInteger(text)) return rat(BigInt(text));
  if (typeof text !== 'string') throw new RangeError(`not a number: ${String(text)}`);
  let m = /^(\d+)\/(\d+)$/.exec(text);
  if (m) return rat(BigInt(m[1]), BigInt(m[2]));
  m = /^(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (!m || (m[1] === '' && (m[2] ?? '') === '')) throw new RangeError(`not a number: ${text}`);
  const frac = m[2] ?? '';
  let value = rat(BigInt((m[1] || '0') + frac), 10n ** BigInt(frac.length));
  const exp = BigInt(m[3] ?? '0');
  value = exp >= 0n ? mul(value, rat(10n ** exp)) : div(value, rat(10n ** -exp));
  return value;
}

/** ceil(a/b) for a >= 0, b > 0. @param {bigint} a @param {bigint} b */
const ceilDiv = (a, b) => (a + b - 1n) / b;

/**
 * Integers (lo, hi) with lo <= 2**bits · e^-x <= hi (veil.dp._exact.exp_neg_bounds).
 * @param {Rational} x @param {bigint} bits
 */
export function expNegBounds(x, bits) {
  const target = rat(1n, 1n << (bits + 8n));
  let partial = rat(0n);
  let term = rat(1n);
  let n = 0n;
  let remainder = rat(0n);
  for (;;) {
    partial = add(partial, term);
    n += 1n;
    term = div(mul(term, x), rat(n));
    if (cmp(rat(n + 1n), mul(rat(2n), x)) > 0) {
      remainder = div(term, sub(rat(1n), div(x, rat(n + 1n))));
      if (cmp(remainder, mul(target, partial)) <= 0) break;
    }
  }
  const scale = 1n << bits;
  const upper = add(partial, remainder);
  const lo = (scale * upper.d) / upper.n;
  const hi = ceilDiv(scale * partial.d, partial.n);
  return { lo, hi };
}

/**
 * The rational odds r <= e^ε of every channel (veil.dp.local.local_odds).
 * @param {Rational} epsilon
 * @returns {Rational}
 */
export function localOdds(epsilon) {
  // bits = 64 + ceil(ε / 0.693)
  const bits = ODDS_BITS + ceilDiv(epsilon.n * 1000n, epsilon.d * 693n);
  const { hi } = expNegBounds(epsilon, bits);
  const odds = rat(1n << bits, hi);
  if (cmp(odds, rat(1n)) <= 0) throw new RangeError('local ε is too small to randomize');
  return odds;
}

/**
 * A uniform BigInt on [0, m) by rejection on k-bit strings.
 * @param {bigint} m @param {(n: number) => Uint8Array} randomBytes
 */
export function randBelow(m, randomBytes) {
  if (m < 1n) throw new RangeError('randBelow needs m >= 1');
  const k = (m - 1n).toString(2).length * (m > 1n ? 1 : 0);
  if (k === 0) return 0n;
  const bytes = Math.ceil(k / 8);
  const mask = (1n << BigInt(k)) - 1n;
  for (;;) {
    let r = 0n;
    for (const b of randomBytes(bytes)) r = (r << 8n) | BigInt(b);
    r &= mask;
    if (r < m) return r;
  }
}

/** k-ary randomized response on an index in [0, k). */
class Kary {
  /** @param {number} k @param {Rational} epsilon */
  constructor(k, epsilon) {
    this.k = BigInt(k);
    this.odds = localOdds(epsilon);
  }

  /** @param {number} index @param {(n: number) => Uint8Array} randomBytes */
  sample(index, randomBytes) {
    const { n: top, d: bottom } = this.odds;
    const u = randBelow(top + (this.k - 1n) * bottom, randomBytes);
    if (u < top) return index;
    const other = Number((u - top) / bottom);
    return other < index ? other : other + 1;
  }
}

/** Binary-output response on an integer in [0, max] (Duchi et al. 2013). */
class Bounded {
  /** @param {bigint} max @param {Rational} epsilon */
  constructor(max, epsilon) {
    this.max = max;
    this.odds = localOdds(epsilon);
  }

  /** @param {bigint} x @param {(n: number) => Uint8Array} randomBytes */
  sample(x, randomBytes) {
    const { n: top, d: bottom } = this.odds;
    const u = randBelow(this.max * (top + bottom), randomBytes);
    return u < this.max * bottom + x * (top - bottom) ? this.max : 0n;
  }
}

/**
 * The task's channel, or null without `local_epsilon`: a function from a
 * measurement the VDAF already accepted to its randomized form.
 * @param {{type: string, [k: string]: any}} vdaf the task's [vdaf] table
 * @param {{local_epsilon?: unknown, local_max_choices?: number} | undefined} dp its [dp] table
 * @param {(n: number) => Uint8Array} randomBytes
 * @returns {((measurement: any) => any) | null}
 */
export function localChannel(vdaf, dp, randomBytes) {
  if (dp === undefined || dp.local_epsilon === undefined || dp.local_epsilon === null) return null;
  const epsilon = parseRational(dp.local_epsilon);
  if (cmp(epsilon, MIN_EPSILON) < 0 || cmp(epsilon, MAX_EPSILON) > 0) {
    throw new RangeError(`local_epsilon must be in [1/1000, 20], got ${String(dp.local_epsilon)}`);
  }
  switch (vdaf.type) {
    case 'count': {
      const channel = new Kary(2, epsilon);
      return (m) => channel.sample(m, randomBytes);
    }
    case 'histogram': {
      const channel = new Kary(vdaf.length, epsilon);
      return (m) => channel.sample(m, randomBytes);
    }
    case 'multihot': {
      const length = vdaf.length;
      if (vdaf.max_weight !== length) {
        throw new RangeError('with local_epsilon a multihot task must have max_weight = length');
      }
      const choices = dp.local_max_choices || length;
      const bit = new Kary(2, div(epsilon, rat(BigInt(Math.min(2 * choices, length)))));
      return (/** @type {unknown[]} */ m) => {
        const weight = m.filter((b) => b === true || b === 1).length;
        if (weight > choices) {
          throw new MeasurementError(
            `a multi-choice answer has at most ${choices} options, got ${weight}`,
          );
        }
        return m.map((b) => bit.sample(b === true || b === 1 ? 1 : 0, randomBytes) === 1);
      };
    }
    case 'sum': {
      const channel = new Bounded(BigInt(vdaf.max_measurement), epsilon);
      return (m) => channel.sample(BigInt(m), randomBytes);
    }
    case 'sumvec': {
      const channel = new Bounded(BigInt(vdaf.max_measurement), div(epsilon, rat(BigInt(vdaf.length))));
      return (/** @type {unknown[]} */ m) => m.map((x) => channel.sample(BigInt(/** @type {any} */ (x)), randomBytes));
    }
    default:
      throw new RangeError(`no local randomized response for VDAF type ${JSON.stringify(vdaf.type)}`);
  }
}
