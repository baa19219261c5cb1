// Extendable-output functions (draft-irtf-cfrg-vdaf-18, Section 6.2;
// veil.vdaf.xof). Only XofTurboShake128: the one Prio3 uses.
//
// TurboSHAKE128 comes from @noble/hashes (sha3-addons): audited, no
// dependencies, tested against the RFC 9861 vectors. It keeps its sponge state
// between xof() calls, so the stream can be read in pieces.

import { turboshake128 } from '@noble/hashes/sha3-addons.js';
import { readLe } from './field.js';

/**
 * TurboSHAKE128 (RFC 9861) with domain byte 1 over
 * le16(len(dst)) || dst || le8(len(seed)) || seed || binder.
 */
export class XofTurboShake128 {
  static SEED_SIZE = 32;

  /**
   * @param {Uint8Array} seed SEED_SIZE bytes
   * @param {Uint8Array} dst domain-separation tag
   * @param {Uint8Array} binder
   */
  constructor(seed, dst, binder) {
    if (seed.length !== XofTurboShake128.SEED_SIZE) {
      throw new RangeError(
        `XofTurboShake128 seed must be ${XofTurboShake128.SEED_SIZE} bytes, got ${seed.length}`,
      );
    }
    if (dst.length > 0xffff) throw new RangeError('domain-separation tag too long');
    this._h = turboshake128.create({ D: 1 });
    this._h.update(new Uint8Array([dst.length & 0xff, dst.length >> 8]));
    this._h.update(dst);
    this._h.update(new Uint8Array([seed.length]));
    this._h.update(seed);
    this._h.update(binder);
  }

  /** The next `length` bytes of the stream. @param {number} length */
  next(length) {
    return this._h.xof(length);
  }

  /**
   * The next `length` field elements: each candidate is ENCODED_SIZE
   * little-endian bytes, masked to the modulus' bit length and kept only if
   * reduced (rejection sampling). Reading several candidates at once consumes
   * the stream exactly as reading them one by one.
   * @param {import('./field.js').Field} field
   * @param {number} length
   * @returns {bigint[]}
   */
  nextVec(field, length) {
    const size = field.ENCODED_SIZE;
    const p = field.MODULUS;
    const mask = (1n << BigInt(field.BITS)) - 1n;
    /** @type {bigint[]} */
    const vec = [];
    while (vec.length < length) {
      const chunk = this.next((length - vec.length) * size);
      const view = new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      for (let i = 0; i < chunk.length; i += size) {
        const x = readLe(view, i, size) & mask;
        if (x < p) vec.push(x);
      }
    }
    return vec;
  }

  /** @param {Uint8Array} seed @param {Uint8Array} dst @param {Uint8Array} binder */
  static deriveSeed(seed, dst, binder) {
    return new XofTurboShake128(seed, dst, binder).next(XofTurboShake128.SEED_SIZE);
  }

  /**
   * @param {import('./field.js').Field} field
   * @param {Uint8Array} seed @param {Uint8Array} dst @param {Uint8Array} binder
   * @param {number} length
   * @returns {bigint[]}
   */
  static expandIntoVec(field, seed, dst, binder, length) {
    return new XofTurboShake128(seed, dst, binder).nextVec(field, length);
  }
}
