// Poplar1 (draft-irtf-cfrg-vdaf-20, Section 8; to be mirrored by
// veil.vdaf.spec.poplar1), the client's half: shard a string of BITS bits into
// a public share (the IDPF's correction words) and two input shares (an IDPF
// key and shares of the correlated randomness with which the aggregators
// check, level by level, that their output shares are one-hot).
//
// Randomness enters only as arguments (nonce, rand); the caller draws it with
// crypto.getRandomValues.

import { MeasurementError } from './circuits.js';
import { Field64, Field255 } from './field.js';
import { IdpfBBCGGI21 } from './idpf.js';
import { concat, formatDst } from './prio3.js';
import { XofFixedKeyAes128, XofTurboShake128 } from './xof.js';

export const USAGE_SHARD_RAND = 1;
export const USAGE_CORR_INNER = 2;
export const USAGE_CORR_LEAF = 3;
export const USAGE_VERIFY_RAND = 4;

/**
 * @typedef {import('./idpf.js').CorrectionWord[]} Poplar1PublicShare
 * @typedef {{key: Uint8Array, corrSeed: Uint8Array, corrInner: bigint[], corrLeaf: bigint[]}} Poplar1InputShare
 */

export class Poplar1 {
  static xof = XofTurboShake128;
  ID = 0x00000006;
  NONCE_SIZE = 16;
  SHARES = 2;
  ROUNDS = 2;

  /** @param {number} bits length of the measured strings */
  constructor(bits) {
    this.idpf = new IdpfBBCGGI21(2, bits);
    this.BITS = bits;
    this.VERIFY_KEY_SIZE = XofTurboShake128.SEED_SIZE;
    this.RAND_SIZE = 3 * XofTurboShake128.SEED_SIZE + this.idpf.RAND_SIZE;
  }

  /** @param {number} usage @param {Uint8Array} ctx */
  domainSeparationTag(usage, ctx) {
    return concat(formatDst(0, this.ID, usage), ctx);
  }

  /**
   * Split `measurement` (BITS booleans, the first one the tree's root level)
   * into a public share and two input shares. Throws MeasurementError on a
   * bad measurement, RangeError on bad argument sizes.
   * @param {Uint8Array} ctx @param {boolean[]} measurement
   * @param {Uint8Array} nonce @param {Uint8Array} rand
   * @returns {{publicShare: Poplar1PublicShare, inputShares: Poplar1InputShare[]}}
   */
  shard(ctx, measurement, nonce, rand) {
    if (nonce.length !== this.NONCE_SIZE) {
      throw new RangeError(`nonce must be ${this.NONCE_SIZE} bytes, got ${nonce.length}`);
    }
    if (rand.length !== this.RAND_SIZE) {
      throw new RangeError(`rand must be ${this.RAND_SIZE} bytes, got ${rand.length}`);
    }
    this._checkMeasurement(measurement);
    const bits = this.BITS;
    const seedSize = XofTurboShake128.SEED_SIZE;
    const idpfRand = rand.subarray(0, this.idpf.RAND_SIZE);
    const at = this.idpf.RAND_SIZE;
    const corrSeed = [
      rand.slice(at, at + seedSize),
      rand.slice(at + seedSize, at + 2 * seedSize),
    ];
    const shardSeed = rand.subarray(at + 2 * seedSize, at + 3 * seedSize);
    const xof = new XofTurboShake128(shardSeed, this.domainSeparationTag(USAGE_SHARD_RAND, ctx), nonce);

    // Each level's IDPF value is (1, k): the data 1 and a random
    // authenticator k with which the aggregators' sketch checks one-hotness.
    const betaInner = xof.nextVec(Field64, bits - 1).map((k) => [1n, k]);
    const betaLeaf = [1n, ...xof.nextVec(Field255, 1)];
    const { publicShare, keys } = this.idpf.gen(measurement, betaInner, betaLeaf, ctx, nonce, idpfRand);

    // The (a, b, c) triples of every level, as the sum of what each
    // aggregator will expand from its correlation seed.
    const offsets = (field, usage, length) => {
      const dst = this.domainSeparationTag(usage, ctx);
      const parts = corrSeed.map((seed, j) =>
        XofTurboShake128.expandIntoVec(field, seed, dst, concat(new Uint8Array([j]), nonce), length),
      );
      return field.vecAdd(parts[0], parts[1]);
    };
    const inner = offsets(Field64, USAGE_CORR_INNER, 3 * (bits - 1));
    const leaf = offsets(Field255, USAGE_CORR_LEAF, 3);

    // Per level, shares of A = -2a + k and B = a^2 + b - a k + c: the helper's
    // drawn from the shard XOF, the leader's the difference.
    /** @type {bigint[][]} */
    const corrInner = [[], []];
    /** @type {bigint[][]} */
    let corrLeaf = [[], []];
    for (let level = 0; level < bits; level++) {
      const isLeaf = level === bits - 1;
      const field = isLeaf ? Field255 : Field64;
      const k = isLeaf ? betaLeaf[1] : betaInner[level][1];
      const [a, b, c] = isLeaf ? leaf : inner.slice(3 * level, 3 * level + 3);
      const A = field.add(field.neg(field.mul(2n, a)), k);
      const B = field.add(field.sub(field.add(field.mul(a, a), b), field.mul(a, k)), c);
      const corr1 = xof.nextVec(field, 2);
      const corr0 = field.vecSub([A, B], corr1);
      if (isLeaf) {
        corrLeaf = [corr0, corr1];
      } else {
        corrInner[0].push(...corr0);
        corrInner[1].push(...corr1);
      }
    }
    const inputShares = [0, 1].map((j) => ({
      key: keys[j],
      corrSeed: corrSeed[j],
      corrInner: corrInner[j],
      corrLeaf: corrLeaf[j],
    }));
    return { publicShare, inputShares };
  }

  /** @param {unknown} measurement */
  _checkMeasurement(measurement) {
    if (!Array.isArray(measurement) || measurement.length !== this.BITS) {
      throw new MeasurementError(`Poplar1 measurement must be a sequence of ${this.BITS} bools`);
    }
    measurement.forEach((bit, i) => {
      if (typeof bit !== 'boolean') {
        throw new MeasurementError(`Poplar1 measurement[${i}] must be a bool`);
      }
    });
  }

  /** @param {Poplar1PublicShare} publicShare */
  encodePublicShare(publicShare) {
    return this.idpf.encodePublicShare(publicShare);
  }

  /**
   * IDPF key || correlation seed || Field64 inner pairs || Field255 leaf pair.
   * @param {Poplar1InputShare} share
   */
  encodeInputShare(share) {
    if (share.key.length !== XofFixedKeyAes128.SEED_SIZE) throw new RangeError('bad IDPF key size');
    if (share.corrSeed.length !== XofTurboShake128.SEED_SIZE) throw new RangeError('bad seed size');
    if (share.corrInner.length !== 2 * (this.BITS - 1) || share.corrLeaf.length !== 2) {
      throw new RangeError('bad correlated randomness length');
    }
    return concat(
      share.key,
      share.corrSeed,
      Field64.encodeVec(share.corrInner),
      Field255.encodeVec(share.corrLeaf),
    );
  }
}
