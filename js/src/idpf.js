// The IDPF of BBCGGI21 (draft-irtf-cfrg-vdaf-20, Section 8.3; to be mirrored
// by veil.vdaf.spec.idpf), the client's half: key generation and the public
// share's encoding. Evaluation runs on the aggregators.
//
// A tree of BITS levels: each level's node is a seed and a control bit, and
// each level publishes one correction word (a seed, two control bits and a
// vector of VALUE_LEN field elements). Inner levels use Field64 and
// XofFixedKeyAes128; the last (leaf) level uses Field255 and XofTurboShake128.

import { Field64, Field255 } from './field.js';
import { formatDst, concat } from './prio3.js';
import { XofFixedKeyAes128, XofTurboShake128 } from './xof.js';

/**
 * @typedef {{seedCw: Uint8Array, ctrlCw: [boolean, boolean], wCw: bigint[]}} CorrectionWord
 */

export class IdpfBBCGGI21 {
  SHARES = 2;
  KEY_SIZE = XofFixedKeyAes128.SEED_SIZE;
  RAND_SIZE = 2 * XofFixedKeyAes128.SEED_SIZE;
  NONCE_SIZE = XofFixedKeyAes128.SEED_SIZE;
  fieldInner = Field64;
  fieldLeaf = Field255;

  /**
   * @param {number} valueLen elements in each level's output
   * @param {number} bits length of the input strings (the tree's depth)
   */
  constructor(valueLen, bits) {
    if (!Number.isInteger(valueLen) || valueLen < 1) {
      throw new RangeError(`value_len must be a positive integer, got ${valueLen}`);
    }
    if (!Number.isInteger(bits) || bits < 1 || bits > 0xffff) {
      throw new RangeError(`bits must be an integer in [1, 65535], got ${bits}`);
    }
    this.VALUE_LEN = valueLen;
    this.BITS = bits;
  }

  /** @param {number} level */
  currentField(level) {
    return level < this.BITS - 1 ? this.fieldInner : this.fieldLeaf;
  }

  /**
   * Key generation: the public share (one correction word per level) and the
   * two aggregators' keys, for the point function that is beta at every prefix
   * of alpha and zero elsewhere.
   * @param {boolean[]} alpha BITS bits, the first one the tree's root level
   * @param {bigint[][]} betaInner BITS - 1 vectors of Field64 (VALUE_LEN each)
   * @param {bigint[]} betaLeaf VALUE_LEN elements of Field255
   * @param {Uint8Array} ctx @param {Uint8Array} nonce NONCE_SIZE bytes
   * @param {Uint8Array} rand RAND_SIZE bytes
   * @returns {{publicShare: CorrectionWord[], keys: Uint8Array[]}}
   */
  gen(alpha, betaInner, betaLeaf, ctx, nonce, rand) {
    if (alpha.length !== this.BITS) throw new RangeError('incorrect alpha length');
    if (betaInner.length !== this.BITS - 1) throw new RangeError('incorrect beta_inner length');
    if (rand.length !== this.RAND_SIZE) throw new RangeError('incorrect rand size');
    if (nonce.length !== this.NONCE_SIZE) throw new RangeError('incorrect nonce size');

    const keys = [rand.slice(0, this.KEY_SIZE), rand.slice(this.KEY_SIZE)];
    const xofs = new LevelXofs(this.BITS, ctx, nonce);
    let seed0 = keys[0];
    let seed1 = keys[1];
    let ctrl0 = false;
    let ctrl1 = true;
    /** @type {CorrectionWord[]} */
    const publicShare = [];
    for (let level = 0; level < this.BITS; level++) {
      const bit = Boolean(alpha[level]);
      const keep = bit ? 1 : 0;
      const lose = 1 - keep;
      const [[s0, t0], [s1, t1]] = this.extend(xofs, level, [seed0, seed1]);
      const seedCw = xor(s0[lose], s1[lose]);
      /** @type {[boolean, boolean]} */
      const ctrlCw = [t0[0] !== t1[0] !== !bit, t0[1] !== t1[1] !== bit];

      // The draft's conditional corrections, as XORs with a mask rather than
      // branches on secret bits (JavaScript promises no constant time, but
      // this keeps the obvious data-dependent branches out).
      const x0 = xorMasked(s0[keep], seedCw, ctrl0);
      const x1 = xorMasked(s1[keep], seedCw, ctrl1);
      ctrl0 = t0[keep] !== (ctrl0 && ctrlCw[keep]);
      ctrl1 = t1[keep] !== (ctrl1 && ctrlCw[keep]);
      const [[next0, w0], [next1, w1]] = this.convert(xofs, level, [x0, x1]);
      seed0 = next0;
      seed1 = next1;

      const field = this.currentField(level);
      const beta = level < this.BITS - 1 ? betaInner[level] : betaLeaf;
      if (beta.length !== this.VALUE_LEN) {
        throw new RangeError('length of beta must match the value length');
      }
      // beta - w0 + w1, negated when the second key's control bit is set.
      let wCw = field.vecAdd(field.vecSub(beta, w0), w1);
      if (ctrl1) wCw = wCw.map((x) => field.neg(x));
      publicShare.push({ seedCw, ctrlCw, wCw });
    }
    return { publicShare, keys };
  }

  /**
   * For each seed, its two child seeds and control bits: each control bit is
   * its child seed's lowest bit, which is then cleared.
   * @param {LevelXofs} xofs @param {number} level @param {Uint8Array[]} seeds
   * @returns {[Uint8Array[], boolean[]][]}
   */
  extend(xofs, level, seeds) {
    return xofs.extend(level, seeds, 2 * this.KEY_SIZE).map((xof) => {
      const s = [xof.next(this.KEY_SIZE), xof.next(this.KEY_SIZE)];
      const t = [(s[0][0] & 1) === 1, (s[1][0] & 1) === 1];
      s[0][0] &= 0xfe;
      s[1][0] &= 0xfe;
      return [s, t];
    });
  }

  /**
   * For each seed, the next level's seed and this level's VALUE_LEN output
   * elements.
   * @param {LevelXofs} xofs @param {number} level @param {Uint8Array[]} seeds
   * @returns {[Uint8Array, bigint[]][]}
   */
  convert(xofs, level, seeds) {
    const field = this.currentField(level);
    // Enough bytes ahead unless an element is rejected (about 2^-32 of the
    // time in Field64); then the XOF reads on.
    const ahead = this.KEY_SIZE + this.VALUE_LEN * field.ENCODED_SIZE;
    return xofs.convert(level, seeds, ahead).map((xof) => [
      xof.next(this.KEY_SIZE),
      xof.nextVec(field, this.VALUE_LEN),
    ]);
  }

  /**
   * Packed control bits (2 per level, least significant bit first), then the
   * seeds, then the inner levels' Field64 vectors, then the leaf's Field255.
   * @param {CorrectionWord[]} publicShare
   * @returns {Uint8Array}
   */
  encodePublicShare(publicShare) {
    if (publicShare.length !== this.BITS) throw new RangeError('incorrect public share length');
    const ctrl = new Uint8Array(Math.ceil((2 * this.BITS) / 8));
    publicShare.forEach(({ ctrlCw }, level) => {
      for (let j = 0; j < 2; j++) {
        const i = 2 * level + j;
        if (ctrlCw[j]) ctrl[i >> 3] |= 1 << (i & 7);
      }
    });
    return concat(
      ctrl,
      ...publicShare.map((cw) => cw.seedCw),
      ...publicShare.map((cw, level) => this.currentField(level).encodeVec(cw.wCw)),
    );
  }
}

/**
 * The XOFs of one key generation: fixed-key AES for the inner levels (two
 * AES keys per report, one for extend and one for convert, built once),
 * TurboSHAKE128 for the leaf.
 */
class LevelXofs {
  /** @param {number} bits @param {Uint8Array} ctx @param {Uint8Array} nonce */
  constructor(bits, ctx, nonce) {
    this.leaf = bits - 1;
    this.nonce = nonce;
    this.extendDst = concat(formatDst(1, 0, 0), ctx);
    this.convertDst = concat(formatDst(1, 0, 1), ctx);
    this.extendKey = XofFixedKeyAes128.key(this.extendDst, nonce);
    this.convertKey = XofFixedKeyAes128.key(this.convertDst, nonce);
  }

  /**
   * The XOFs of extend for each seed, `ahead` bytes computed at once.
   * @param {number} level @param {Uint8Array[]} seeds @param {number} ahead
   * @returns {(XofFixedKeyAes128 | XofTurboShake128)[]}
   */
  extend(level, seeds, ahead) {
    if (level < this.leaf) return this.extendKey.xofs(seeds, ahead);
    return seeds.map((seed) => new XofTurboShake128(seed, this.extendDst, this.nonce));
  }

  /**
   * The XOFs of convert for each seed, `ahead` bytes computed at once.
   * @param {number} level @param {Uint8Array[]} seeds @param {number} ahead
   * @returns {(XofFixedKeyAes128 | XofTurboShake128)[]}
   */
  convert(level, seeds, ahead) {
    if (level < this.leaf) return this.convertKey.xofs(seeds, ahead);
    return seeds.map((seed) => new XofTurboShake128(seed, this.convertDst, this.nonce));
  }
}

/** @param {Uint8Array} a @param {Uint8Array} b */
function xor(a, b) {
  const out = new Uint8Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] ^ b[i];
  return out;
}

/** a XOR b where `on`, else a copy of a. @param {Uint8Array} a @param {Uint8Array} b @param {boolean} on */
function xorMasked(a, b, on) {
  const mask = -Number(on) & 0xff;
  const out = new Uint8Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] ^ (b[i] & mask);
  return out;
}
