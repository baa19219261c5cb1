// Prime fields of draft-irtf-cfrg-vdaf, Section 6.1 (veil.vdaf.field): Field64
// and Field128 for Prio3, Field64 and Field255 for Poplar1's IDPF.
//
// Elements are BigInts in [0, MODULUS); vectors are arrays of them. The codec
// (encodeVec / decodeVec) is the one place where bytes meet field elements:
// little-endian, fixed width, reduced.

/** Thrown on bytes that are not a vector of reduced elements. */
export class CodecError extends Error {
  constructor(message) {
    super(message);
    this.name = 'CodecError';
  }
}

/**
 * A prime field with a multiplicative subgroup of order GEN_ORDER (a power of
 * two), so that polynomials can be handled with the NTT.
 */
export class Field {
  /**
   * @param {string} name
   * @param {bigint} modulus
   * @param {number} encodedSize bytes per element (8, 16 or 32)
   * @param {bigint} genOrder
   * @param {bigint} generator a generator of the subgroup of order genOrder
   */
  constructor(name, modulus, encodedSize, genOrder, generator) {
    this.name = name;
    this.MODULUS = modulus;
    this.ENCODED_SIZE = encodedSize;
    this.GEN_ORDER = genOrder;
    this.GENERATOR = generator;
    /** Bit length of the modulus; XOF candidates are masked to it. */
    this.BITS = modulus.toString(2).length;
    /** @type {Map<number, bigint[]>} powers of the n-th root, per n (built once) */
    this._nodes = new Map();
  }

  /** @param {bigint} a @param {bigint} b @returns {bigint} */
  add(a, b) {
    const s = a + b;
    return s >= this.MODULUS ? s - this.MODULUS : s;
  }

  /** @param {bigint} a @param {bigint} b @returns {bigint} */
  sub(a, b) {
    const d = a - b;
    return d < 0n ? d + this.MODULUS : d;
  }

  /** @param {bigint} a @param {bigint} b @returns {bigint} */
  mul(a, b) {
    return (a * b) % this.MODULUS;
  }

  /** @param {bigint} a @returns {bigint} */
  neg(a) {
    return a === 0n ? 0n : this.MODULUS - a;
  }

  /** Reduce any BigInt (possibly negative) into the field. @param {bigint} a */
  reduce(a) {
    const r = a % this.MODULUS;
    return r < 0n ? r + this.MODULUS : r;
  }

  /** @param {bigint} base @param {bigint} exponent @returns {bigint} */
  pow(base, exponent) {
    const p = this.MODULUS;
    let result = 1n;
    let b = base % p;
    let e = exponent;
    while (e > 0n) {
      if (e & 1n) result = (result * b) % p;
      b = (b * b) % p;
      e >>= 1n;
    }
    return result;
  }

  /** Multiplicative inverse (Fermat). @param {bigint} a */
  inv(a) {
    if (a === 0n) throw new RangeError('zero has no inverse');
    return this.pow(a, this.MODULUS - 2n);
  }

  /** @param {number} length @returns {bigint[]} */
  zeros(length) {
    return new Array(length).fill(0n);
  }

  /**
   * Encode reduced elements as ENCODED_SIZE little-endian bytes each.
   * @param {bigint[]} vec
   * @returns {Uint8Array}
   */
  encodeVec(vec) {
    const size = this.ENCODED_SIZE;
    const out = new Uint8Array(vec.length * size);
    const view = new DataView(out.buffer);
    const mask64 = 0xffffffffffffffffn;
    for (let i = 0; i < vec.length; i++) {
      let x = vec[i];
      for (let word = 0; word < size; word += 8) {
        view.setBigUint64(i * size + word, x & mask64, true);
        x >>= 64n;
      }
    }
    return out;
  }

  /**
   * Inverse of encodeVec; throws CodecError on a length that is not a
   * multiple of ENCODED_SIZE or on an unreduced element.
   * @param {Uint8Array} encoded
   * @returns {bigint[]}
   */
  decodeVec(encoded) {
    const size = this.ENCODED_SIZE;
    if (encoded.length % size !== 0) {
      throw new CodecError(
        `${this.name} vector: ${encoded.length} bytes is not a multiple of ${size}`,
      );
    }
    const view = new DataView(encoded.buffer, encoded.byteOffset, encoded.byteLength);
    const vec = [];
    for (let i = 0; i < encoded.length; i += size) {
      const x = readLe(view, i, size);
      if (x >= this.MODULUS) {
        throw new CodecError(`${this.name} element is not reduced modulo the prime`);
      }
      vec.push(x);
    }
    return vec;
  }

  /** @param {bigint[]} left @param {bigint[]} right @returns {bigint[]} */
  vecAdd(left, right) {
    checkSameLength(left, right);
    return left.map((a, i) => this.add(a, right[i]));
  }

  /** @param {bigint[]} left @param {bigint[]} right @returns {bigint[]} */
  vecSub(left, right) {
    checkSameLength(left, right);
    return left.map((a, i) => this.sub(a, right[i]));
  }

  /**
   * A primitive n-th root of unity (n a power of two dividing GEN_ORDER): the
   * draft's root, so that polynomial evaluations in proofs agree byte for byte.
   * @param {number} n
   * @returns {bigint}
   */
  rootOfUnity(n) {
    const big = BigInt(n);
    if (n <= 0 || (n & (n - 1)) !== 0 || this.GEN_ORDER % big !== 0n) {
      throw new RangeError(`no ${n}-th root of unity in ${this.name}`);
    }
    return this.pow(this.GENERATOR, this.GEN_ORDER / big);
  }

  /**
   * [w^0, w^1, ..., w^(n-1)] for the primitive n-th root w; computed once per
   * n and kept, since every proof of a task uses the same few sizes.
   * @param {number} n
   * @returns {bigint[]}
   */
  nodes(n) {
    let nodes = this._nodes.get(n);
    if (nodes === undefined) {
      const w = this.rootOfUnity(n);
      nodes = [1n];
      for (let i = 1; i < n; i++) nodes.push(this.mul(nodes[i - 1], w));
      this._nodes.set(n, nodes);
    }
    return nodes;
  }
}

/**
 * The little-endian integer of `size` (a multiple of 8) bytes at `offset`.
 * @param {DataView} view @param {number} offset @param {number} size
 * @returns {bigint}
 */
export function readLe(view, offset, size) {
  const lo = view.getBigUint64(offset, true);
  if (size === 8) return lo;
  if (size === 16) return lo | (view.getBigUint64(offset + 8, true) << 64n);
  let x = 0n;
  for (let word = size - 8; word >= 0; word -= 8) {
    x = (x << 64n) | view.getBigUint64(offset + word, true);
  }
  return x;
}

function checkSameLength(left, right) {
  if (left.length !== right.length) {
    throw new RangeError(`vector lengths differ: ${left.length} != ${right.length}`);
  }
}

const P64 = 2n ** 32n * 4294967295n + 1n;
const P128 = 2n ** 66n * 4611686018427387897n + 1n;
const P255 = 2n ** 255n - 19n;

function makeField(name, modulus, size, genOrder, cofactor) {
  const f = new Field(name, modulus, size, genOrder, 0n);
  f.GENERATOR = f.pow(7n, cofactor);
  return f;
}

/** GF(2^32 * 4294967295 + 1). */
export const Field64 = makeField('Field64', P64, 8, 2n ** 32n, 4294967295n);

/** GF(2^66 * 4611686018427387897 + 1). */
export const Field128 = makeField('Field128', P128, 16, 2n ** 66n, 4611686018427387897n);

/**
 * GF(2^255 - 19): the leaf level of Poplar1's IDPF. The draft uses no NTT in
 * it, so it carries no subgroup (rootOfUnity refuses every size but 1).
 */
export const Field255 = new Field('Field255', P255, 32, 1n, 1n);
