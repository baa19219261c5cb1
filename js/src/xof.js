// Extendable-output functions (draft-irtf-cfrg-vdaf-20, Section 6.2;
// veil.vdaf.xof): XofTurboShake128 (Prio3, Poplar1) and XofFixedKeyAes128
// (the inner levels of Poplar1's IDPF).
//
// TurboSHAKE128 comes from @noble/hashes (sha3-addons): audited, no
// dependencies, tested against the RFC 9861 vectors. It keeps its sponge state
// between xof() calls, so the stream can be read in pieces. AES-128 comes from
// @noble/ciphers (same author, audited, no dependencies), used block by block
// (ECB without padding) under a key that is public by design.

import { ecb } from '@noble/ciphers/aes.js';
import { turboshake128 } from '@noble/hashes/sha3-addons.js';
import { readLe } from './field.js';

/**
 * The next `length` field elements of an XOF's stream: each candidate is
 * ENCODED_SIZE little-endian bytes, masked to the modulus' bit length and kept
 * only if reduced (rejection sampling). Reading several candidates at once
 * consumes the stream exactly as reading them one by one.
 * @param {{next(length: number): Uint8Array}} xof
 * @param {import('./field.js').Field} field
 * @param {number} length
 * @returns {bigint[]}
 */
function readVec(xof, field, length) {
  const size = field.ENCODED_SIZE;
  const p = field.MODULUS;
  // No mask when the modulus fills its encoding (Field64, Field128).
  const mask = field.BITS === 8 * size ? null : (1n << BigInt(field.BITS)) - 1n;
  /** @type {bigint[]} */
  const vec = [];
  while (vec.length < length) {
    const chunk = xof.next((length - vec.length) * size);
    const view = new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    for (let i = 0; i < chunk.length; i += size) {
      const x = mask === null ? readLe(view, i, size) : readLe(view, i, size) & mask;
      if (x < p) vec.push(x);
    }
  }
  return vec;
}

/**
 * TurboSHAKE128 (RFC 9861) with domain byte 1 over
 * le16(len(dst)) || dst || le8(len(seed)) || seed || binder.
 */
export class XofTurboShake128 {
  static SEED_SIZE = 32;

  /**
   * @param {Uint8Array} seed SEED_SIZE bytes, except in the last level of
   *   Poplar1's IDPF, whose seeds are XofFixedKeyAes128's 16 bytes (the
   *   length is part of the hashed input, so any length up to 255 is sound)
   * @param {Uint8Array} dst domain-separation tag
   * @param {Uint8Array} binder
   */
  constructor(seed, dst, binder) {
    if (seed.length > 0xff) {
      throw new RangeError(`XofTurboShake128 seed must be at most 255 bytes, got ${seed.length}`);
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
   * The next `length` field elements (rejection sampling, as readVec).
   * @param {import('./field.js').Field} field
   * @param {number} length
   * @returns {bigint[]}
   */
  nextVec(field, length) {
    return readVec(this, field, length);
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

/**
 * The draft's XOF from fixed-key AES-128: the AES key is TurboSHAKE128 (domain
 * byte 2) of le16(len(dst)) || dst || binder, public, the same for every seed
 * of a report; block i of the stream is hash(seed XOR le128(i)) with the
 * correlation-robust hash hash(x) = AES(key, sigma(x)) XOR sigma(x), where
 * sigma(lo || hi) = hi || (hi XOR lo) on 8-byte halves.
 *
 * The key depends on (dst, binder) only: `key` derives it once for the many
 * seeds of one report (the IDPF's), and FixedKeyAes128.xofs computes the
 * first bytes of several seeds' streams in one AES call.
 */
export class XofFixedKeyAes128 {
  static SEED_SIZE = 16;

  /**
   * @param {Uint8Array} seed SEED_SIZE bytes
   * @param {Uint8Array | null} dst domain-separation tag (unused with `key`)
   * @param {Uint8Array | null} binder (unused with `key`)
   * @param {FixedKeyAes128} [key] XofFixedKeyAes128.key(dst, binder), if derived already
   */
  constructor(seed, dst, binder, key) {
    if (seed.length !== XofFixedKeyAes128.SEED_SIZE) {
      throw new RangeError(
        `XofFixedKeyAes128 seed must be ${XofFixedKeyAes128.SEED_SIZE} bytes, got ${seed.length}`,
      );
    }
    // dst and binder are needed only when no key is given.
    this._key = key ?? new FixedKeyAes128(dst, binder);
    this._seed = seed;
    this._consumed = 0;
    /** The stream's first bytes, when computed ahead (FixedKeyAes128.xofs). */
    this._ahead = new Uint8Array(0);
  }

  /** The AES key for (dst, binder). @param {Uint8Array} dst @param {Uint8Array} binder */
  static key(dst, binder) {
    return new FixedKeyAes128(dst, binder);
  }

  /** The next `length` bytes of the stream. @param {number} length */
  next(length) {
    if (this._consumed + length <= this._ahead.length) {
      this._consumed += length;
      return this._ahead.slice(this._consumed - length, this._consumed);
    }
    if (length === 0) return new Uint8Array(0);
    const first = Math.floor(this._consumed / 16);
    const last = Math.floor((this._consumed + length - 1) / 16);
    const offset = this._consumed % 16;
    this._consumed += length;
    return this._key.blocks([this._seed], first, last - first + 1).subarray(offset, offset + length);
  }

  /**
   * @param {import('./field.js').Field} field
   * @param {number} length
   * @returns {bigint[]}
   */
  nextVec(field, length) {
    return readVec(this, field, length);
  }

  /** @param {Uint8Array} seed @param {Uint8Array} dst @param {Uint8Array} binder */
  static deriveSeed(seed, dst, binder) {
    return new XofFixedKeyAes128(seed, dst, binder).next(XofFixedKeyAes128.SEED_SIZE);
  }

  /**
   * @param {import('./field.js').Field} field
   * @param {Uint8Array} seed @param {Uint8Array} dst @param {Uint8Array} binder
   * @param {number} length
   * @returns {bigint[]}
   */
  static expandIntoVec(field, seed, dst, binder, length) {
    return new XofFixedKeyAes128(seed, dst, binder).nextVec(field, length);
  }
}

/** The AES-128 key of XofFixedKeyAes128 for one (dst, binder). */
export class FixedKeyAes128 {
  /** @param {Uint8Array} dst @param {Uint8Array} binder */
  constructor(dst, binder) {
    if (dst.length > 0xffff) throw new RangeError('domain-separation tag too long');
    const h = turboshake128.create({ D: 2 });
    h.update(new Uint8Array([dst.length & 0xff, dst.length >> 8]));
    h.update(dst);
    h.update(binder);
    this._key = h.xof(16);
  }

  /**
   * Blocks first .. first + count - 1 of each seed's stream, seed after seed,
   * in one AES call.
   * @param {Uint8Array[]} seeds @param {number} first @param {number} count
   * @returns {Uint8Array} seeds.length * count * 16 bytes
   */
  blocks(seeds, first, count) {
    const sigma = new Uint8Array(seeds.length * count * 16);
    const x = new Uint8Array(16);
    let at = 0;
    for (const seed of seeds) {
      for (let i = first; i < first + count; i++, at += 16) {
        // x = seed XOR le128(i) (i < 2^53: its bytes 8..15 are zero)...
        x.set(seed);
        const lo = i >>> 0;
        const hi = Math.floor(i / 0x100000000);
        for (let j = 0; j < 4; j++) {
          x[j] ^= (lo >>> (8 * j)) & 0xff;
          x[4 + j] ^= (hi >>> (8 * j)) & 0xff;
        }
        // ...then sigma(x) = high half || (high XOR low).
        for (let j = 0; j < 8; j++) {
          sigma[at + j] = x[8 + j];
          sigma[at + 8 + j] = x[8 + j] ^ x[j];
        }
      }
    }
    // @noble/ciphers refuses a second encrypt() on one cipher object (a guard
    // against nonce reuse, which ECB under a public key does not need): one
    // object per call, from the same 16 key bytes.
    const out = ecb(this._key, { disablePadding: true }).encrypt(sigma);
    for (let j = 0; j < out.length; j++) out[j] ^= sigma[j];
    return out;
  }

  /**
   * One XOF per seed under this key, the first `length` bytes of each stream
   * computed ahead in one AES call (reading on past them costs a call each).
   * @param {Uint8Array[]} seeds @param {number} length
   * @returns {XofFixedKeyAes128[]}
   */
  xofs(seeds, length) {
    const count = Math.ceil(length / 16);
    const all = this.blocks(seeds, 0, count);
    return seeds.map((seed, k) => {
      const xof = new XofFixedKeyAes128(seed, null, null, this);
      xof._ahead = all.subarray(k * count * 16, (k + 1) * count * 16);
      return xof;
    });
  }
}
