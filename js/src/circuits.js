// Validity circuits (draft-irtf-cfrg-vdaf-18, Section 7.4; veil.vdaf.circuits).
//
// A circuit fixes how a measurement is encoded as field elements and which
// affine-plus-gadget computation is zero exactly on valid encodings. Circuits
// know nothing about proofs: eval() receives the gadgets to call, so the FLP
// can record their inputs while the circuit code stays the same.
//
// Measurement checks throw MeasurementError with the words of the Python
// client's ValueError, naming Python's type where the JavaScript value would
// be that type in Python (a non-integer number is a "float", a string a "str").

import { Mul, ParallelSum, PolyEval } from './gadgets.js';

/** @typedef {import('./field.js').Field} Field */
/** @typedef {(inp: bigint[]) => bigint} GadgetCall */

/** A measurement or parameter out of range or of the wrong type. */
export class MeasurementError extends RangeError {
  constructor(message) {
    super(message);
    this.name = 'MeasurementError';
  }
}

/** The name Python would give this value's type. @param {unknown} v */
function pyType(v) {
  if (v === null || v === undefined) return 'NoneType';
  if (typeof v === 'boolean') return 'bool';
  if (typeof v === 'string') return 'str';
  if (typeof v === 'number') return Number.isSafeInteger(v) ? 'int' : 'float';
  if (typeof v === 'bigint') return 'int';
  if (Array.isArray(v)) return 'list';
  return 'dict';
}

/** Python's repr of a simple value. @param {unknown} v */
function pyRepr(v) {
  if (v === true) return 'True';
  if (v === false) return 'False';
  if (v === null || v === undefined) return 'None';
  if (typeof v === 'string') return `'${v}'`;
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(', ')}]`;
  return String(v);
}

/**
 * Check an integer (a safe-integer Number or a BigInt, never a boolean) in
 * [low, high]; return it as a BigInt.
 * @param {string} name @param {unknown} value @param {bigint} low @param {bigint|null} [high]
 * @returns {bigint}
 */
export function requireInt(name, value, low, high = null) {
  let v;
  if (typeof value === 'bigint') v = value;
  else if (typeof value === 'number' && Number.isSafeInteger(value)) v = BigInt(value);
  else throw new MeasurementError(`${name} must be an int, not ${pyType(value)}`);
  if (v < low || (high !== null && v > high)) {
    const bound = high !== null ? `[${low}, ${high}]` : `>= ${low}`;
    throw new MeasurementError(`${name} must be in ${bound}, got ${v}`);
  }
  return v;
}

/** @param {string} name @param {unknown} value @param {number} length @returns {unknown[]} */
function requireSequence(name, value, length) {
  if (!Array.isArray(value)) throw new MeasurementError(`${name} must be a sequence of ${length} entries`);
  if (value.length !== length) {
    throw new MeasurementError(`${name} must have exactly ${length} entries, got ${value.length}`);
  }
  return value;
}

/** Bit length of a positive BigInt. @param {bigint} x */
function bitLength(x) {
  return x === 0n ? 0 : x.toString(2).length;
}

/**
 * Encode `value` in [0, maxMeasurement] as bits with weights 1, 2, 4, ...,
 * 2^(b-2) and a last weight maxMeasurement - (2^(b-1) - 1), so that every 0/1
 * vector decodes into the range and nothing else does.
 * @param {bigint} value @param {bigint} maxMeasurement @returns {bigint[]}
 */
export function encodeRangeCheckedInt(value, maxMeasurement) {
  const bits = bitLength(maxMeasurement);
  const restAllOnes = (1n << BigInt(bits - 1)) - 1n;
  let rest = value;
  let last = 0n;
  if (value > restAllOnes) {
    rest = value - (maxMeasurement - restAllOnes);
    last = 1n;
  }
  const out = [];
  for (let i = 0; i < bits - 1; i++) out.push((rest >> BigInt(i)) & 1n);
  out.push(last);
  return out;
}

/**
 * The range check shared by SumVec, Histogram, MultihotCountVec and
 * L1BoundSum: a random linear combination (powers of jointRand[i] within chunk i) of x * (x - 1)
 * over every entry, each chunk one ParallelSum call.
 * @param {Field} field @param {bigint[]} meas @param {bigint[]} jointRand
 * @param {number} numShares @param {number} calls @param {number} chunkLength
 * @param {GadgetCall} gadget
 */
function chunkedBitCheck(field, meas, jointRand, numShares, calls, chunkLength, gadget) {
  const p = field.MODULUS;
  const sharesInv = field.inv(BigInt(numShares));
  let total = 0n;
  for (let i = 0; i < calls; i++) {
    const r = jointRand[i];
    let rPower = r;
    const inputs = new Array(2 * chunkLength);
    const base = i * chunkLength;
    for (let j = 0; j < chunkLength; j++) {
      const index = base + j;
      const x = index < meas.length ? meas[index] : 0n;
      inputs[2 * j] = (rPower * x) % p;
      inputs[2 * j + 1] = field.sub(x, sharesInv);
      rPower = (rPower * r) % p;
    }
    total += gadget(inputs);
  }
  return total % p;
}

/** A measurement of 0 or 1; valid iff x * x - x == 0. */
export class Count {
  MEAS_LEN = 1;
  JOINT_RAND_LEN = 0;
  OUTPUT_LEN = 1;
  EVAL_OUTPUT_LEN = 1;

  /** @param {Field} field */
  constructor(field) {
    this.field = field;
    this.GADGETS = [new Mul()];
    this.GADGET_CALLS = [1];
  }

  /** @param {unknown} measurement */
  encode(measurement) {
    return [requireInt('Count measurement', measurement, 0n, 1n)];
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  eval(meas, jointRand, numShares, gadgets) {
    return [this.field.sub(gadgets[0]([meas[0], meas[0]]), meas[0])];
  }
}

/** An integer in [0, max_measurement]; each bit checked by PolyEval(x^2 - x). */
export class Sum {
  JOINT_RAND_LEN = 0;
  OUTPUT_LEN = 1;

  /** @param {Field} field @param {number|bigint} maxMeasurement */
  constructor(field, maxMeasurement) {
    this.field = field;
    this.maxMeasurement = requireInt('max_measurement', maxMeasurement, 1n);
    this.bits = bitLength(this.maxMeasurement);
    if (1n << BigInt(this.bits) >= field.MODULUS) {
      throw new MeasurementError(`max_measurement needs ${this.bits} bits; too large for the field`);
    }
    this.GADGETS = [new PolyEval([0, -1, 1])];
    this.GADGET_CALLS = [this.bits];
    this.MEAS_LEN = this.bits;
    this.EVAL_OUTPUT_LEN = this.bits;
  }

  /** @param {unknown} measurement */
  encode(measurement) {
    const v = requireInt('Sum measurement', measurement, 0n, this.maxMeasurement);
    return encodeRangeCheckedInt(v, this.maxMeasurement);
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  eval(meas, jointRand, numShares, gadgets) {
    return meas.map((b) => gadgets[0]([b]));
  }
}

/** Encoding as bits checked in chunks by one ParallelSum(Mul) gadget. */
class ChunkedBitCircuit {
  /** @param {Field} field @param {number} chunkLength @param {number} measLen */
  constructor(field, chunkLength, measLen) {
    this.field = field;
    this.chunkLength = Number(requireInt('chunk_length', chunkLength, 1n));
    this.GADGETS = [new ParallelSum(new Mul(), this.chunkLength)];
    this.GADGET_CALLS = [Math.ceil(measLen / this.chunkLength)];
    this.MEAS_LEN = measLen;
    this.JOINT_RAND_LEN = this.GADGET_CALLS[0];
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  bitCheck(meas, jointRand, numShares, gadgets) {
    return chunkedBitCheck(
      this.field, meas, jointRand, numShares, this.GADGET_CALLS[0], this.chunkLength, gadgets[0],
    );
  }
}

/** A vector of `length` integers, each in [0, max_measurement]. */
export class SumVec extends ChunkedBitCircuit {
  EVAL_OUTPUT_LEN = 1;

  /** @param {Field} field @param {number} length @param {number|bigint} maxMeasurement @param {number} chunkLength */
  constructor(field, length, maxMeasurement, chunkLength) {
    const len = Number(requireInt('length', length, 1n));
    const max = requireInt('max_measurement', maxMeasurement, 1n);
    requireInt('chunk_length', chunkLength, 1n);
    const bits = bitLength(max);
    if (1n << BigInt(bits) >= field.MODULUS) {
      throw new MeasurementError(`max_measurement needs ${bits} bits; too large for the field`);
    }
    super(field, chunkLength, len * bits);
    this.length = len;
    this.maxMeasurement = max;
    this.bits = bits;
    this.OUTPUT_LEN = len;
  }

  /** @param {unknown} measurement */
  encode(measurement) {
    const values = requireSequence('SumVec measurement', measurement, this.length);
    const encoded = [];
    values.forEach((value, i) => {
      const v = requireInt(`SumVec measurement[${i}]`, value, 0n, this.maxMeasurement);
      encoded.push(...encodeRangeCheckedInt(v, this.maxMeasurement));
    });
    return encoded;
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  eval(meas, jointRand, numShares, gadgets) {
    return [this.bitCheck(meas, jointRand, numShares, gadgets)];
  }
}

/** An index in [0, length), one-hot encoded; valid iff every entry is a bit
 * and the entries sum to one. */
export class Histogram extends ChunkedBitCircuit {
  EVAL_OUTPUT_LEN = 2;

  /** @param {Field} field @param {number} length @param {number} chunkLength */
  constructor(field, length, chunkLength) {
    const len = Number(requireInt('length', length, 1n));
    requireInt('chunk_length', chunkLength, 1n);
    super(field, chunkLength, len);
    this.length = len;
    this.OUTPUT_LEN = len;
  }

  /** @param {unknown} measurement */
  encode(measurement) {
    const index = requireInt('Histogram measurement', measurement, 0n, BigInt(this.length - 1));
    const encoded = this.field.zeros(this.length);
    encoded[Number(index)] = 1n;
    return encoded;
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  eval(meas, jointRand, numShares, gadgets) {
    const f = this.field;
    const rangeCheck = this.bitCheck(meas, jointRand, numShares, gadgets);
    const total = meas.reduce((a, b) => a + b, 0n);
    return [rangeCheck, f.reduce(total - f.inv(BigInt(numShares)))];
  }
}

/** A bit vector of `length` entries with at most max_weight ones; the client
 * also encodes the claimed weight, range-checked like Sum. */
export class MultihotCountVec extends ChunkedBitCircuit {
  EVAL_OUTPUT_LEN = 2;

  /** @param {Field} field @param {number} length @param {number} maxWeight @param {number} chunkLength */
  constructor(field, length, maxWeight, chunkLength) {
    const len = Number(requireInt('length', length, 1n));
    const weight = requireInt('max_weight', maxWeight, 1n, BigInt(len));
    requireInt('chunk_length', chunkLength, 1n);
    const bitsForWeight = bitLength(weight);
    super(field, chunkLength, len + bitsForWeight);
    this.length = len;
    this.maxWeight = weight;
    this.bitsForWeight = bitsForWeight;
    this.OUTPUT_LEN = len;
  }

  /** @param {unknown} measurement booleans (or 0/1) */
  encode(measurement) {
    const values = requireSequence('MultihotCountVec measurement', measurement, this.length);
    const counts = values.map((x, i) => {
      if (x === true || x === 1) return 1n;
      if (x === false || x === 0) return 0n;
      throw new MeasurementError(`MultihotCountVec measurement[${i}] must be a bool, got ${pyRepr(x)}`);
    });
    const weight = counts.reduce((a, b) => a + b, 0n);
    if (weight > this.maxWeight) {
      throw new MeasurementError(
        `MultihotCountVec measurement has ${weight} entries set; ` +
          `at most max_weight=${this.maxWeight} are allowed`,
      );
    }
    return counts.concat(encodeRangeCheckedInt(weight, this.maxWeight));
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  eval(meas, jointRand, numShares, gadgets) {
    const f = this.field;
    const rangeCheck = this.bitCheck(meas, jointRand, numShares, gadgets);
    let weight = 0n;
    for (let i = 0; i < this.length; i++) weight += meas[i];
    const bits = meas.slice(this.length);
    const lastWeight = this.maxWeight - ((1n << BigInt(this.bitsForWeight - 1)) - 1n);
    let reported = 0n;
    for (let i = 0; i < this.bitsForWeight - 1; i++) reported += bits[i] << BigInt(i);
    reported += lastWeight * bits[this.bitsForWeight - 1];
    return [rangeCheck, f.reduce(weight - reported)];
  }
}

/**
 * Inverse of encodeRangeCheckedInt on (a share of) its bits; linear.
 * @param {Field} field @param {bigint[]} bits @param {bigint} maxMeasurement
 */
function decodeRangeCheckedInt(field, bits, maxMeasurement) {
  const n = bitLength(maxMeasurement);
  const lastWeight = maxMeasurement - ((1n << BigInt(n - 1)) - 1n);
  let total = 0n;
  for (let i = 0; i < n - 1; i++) total += bits[i] << BigInt(i);
  return field.reduce(total + lastWeight * bits[n - 1]);
}

/** A vector of `length` non-negative integers summing to at most max_value
 * (draft-ietf-ppm-l1-bound-sum-02): each entry and then the claimed sum
 * encoded as SumVec encodes its entries; the circuit checks every bit and
 * that the entries add up to the claimed sum. */
export class L1BoundSum extends ChunkedBitCircuit {
  EVAL_OUTPUT_LEN = 2;

  /** @param {Field} field @param {number} length @param {number|bigint} maxValue @param {number} chunkLength */
  constructor(field, length, maxValue, chunkLength) {
    const len = Number(requireInt('length', length, 1n));
    const max = requireInt('max_value', maxValue, 1n);
    requireInt('chunk_length', chunkLength, 1n);
    if (BigInt(len) * max >= field.MODULUS) {
      throw new MeasurementError('length * max_value is too large for the field');
    }
    const bits = bitLength(max);
    super(field, chunkLength, (len + 1) * bits);
    this.length = len;
    this.maxValue = max;
    this.bits = bits;
    this.OUTPUT_LEN = len;
  }

  /** @param {unknown} measurement */
  encode(measurement) {
    const values = requireSequence('L1BoundSum measurement', measurement, this.length);
    const encoded = [];
    let total = 0n;
    values.forEach((value, i) => {
      const v = requireInt(`L1BoundSum measurement[${i}]`, value, 0n, this.maxValue);
      encoded.push(...encodeRangeCheckedInt(v, this.maxValue));
      total += v;
    });
    if (total > this.maxValue) {
      throw new MeasurementError(
        `L1BoundSum measurement sums to ${total}; at most max_value=${this.maxValue}`,
      );
    }
    return encoded.concat(encodeRangeCheckedInt(total, this.maxValue));
  }

  /** @param {bigint[]} meas @param {bigint[]} jointRand @param {number} numShares @param {GadgetCall[]} gadgets */
  eval(meas, jointRand, numShares, gadgets) {
    const f = this.field;
    const b = this.bits;
    const rangeCheck = this.bitCheck(meas, jointRand, numShares, gadgets);
    let observed = 0n;
    for (let i = 0; i < this.length; i++) {
      observed += decodeRangeCheckedInt(f, meas.slice(i * b, (i + 1) * b), this.maxValue);
    }
    const claimed = decodeRangeCheckedInt(f, meas.slice(this.length * b), this.maxValue);
    return [rangeCheck, f.reduce(observed - claimed)];
  }
}
