// Prio3 (draft-irtf-cfrg-vdaf-18, Section 7; veil.vdaf.prio3), the client's
// half: shard a measurement into a public share and two input shares.
//
// Method names, argument order and constants mirror the draft and the Python
// module. Randomness enters only as arguments (nonce, rand); the caller draws
// it with crypto.getRandomValues.

import * as circuits from './circuits.js';
import { Field64, Field128 } from './field.js';
import { FlpBBCGGI19 } from './flp.js';
import { XofTurboShake128 } from './xof.js';

/** Version byte of the domain-separation tags: drafts 18 to 20 share it. */
export const VERSION = 18;

export const USAGE_MEAS_SHARE = 1;
export const USAGE_PROOF_SHARE = 2;
export const USAGE_JOINT_RANDOMNESS = 3;
export const USAGE_PROVE_RANDOMNESS = 4;
export const USAGE_QUERY_RANDOMNESS = 5;
export const USAGE_JOINT_RAND_SEED = 6;
export const USAGE_JOINT_RAND_PART = 7;

/**
 * @typedef {{measShare: bigint[], proofsShare: bigint[], blind: Uint8Array|null}} LeaderInputShare
 * @typedef {{share: Uint8Array, blind: Uint8Array|null}} HelperInputShare
 * @typedef {LeaderInputShare | HelperInputShare} InputShare
 * @typedef {Uint8Array[] | null} PublicShare the joint randomness parts, if used
 */

/** VERSION || algo_class || algo (4 bytes) || usage (2 bytes), big-endian. */
export function formatDst(algoClass, algo, usage) {
  const out = new Uint8Array(8);
  const view = new DataView(out.buffer);
  out[0] = VERSION;
  out[1] = algoClass;
  view.setUint32(2, algo >>> 0);
  view.setUint16(6, usage);
  return out;
}

/** @param {...Uint8Array} parts */
export function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

/** Prio3 over a validity circuit, with SHARES aggregators and PROOFS proofs. */
export class Prio3 {
  static xof = XofTurboShake128;
  NONCE_SIZE = 16;

  /**
   * @param {number} id the VDAF's codepoint
   * @param {number} shares
   * @param {any} valid a circuit from circuits.js
   * @param {number} numProofs
   */
  constructor(id, shares, valid, numProofs) {
    this.ID = id;
    this.SHARES = Number(circuits.requireInt('shares', shares, 2n, 255n));
    this.PROOFS = Number(circuits.requireInt('num_proofs', numProofs, 1n, 255n));
    this.flp = new FlpBBCGGI19(valid);
    this.field = valid.field;
    const seed = XofTurboShake128.SEED_SIZE;
    // One seed per helper share and the prove seed, plus one blind per
    // aggregator when the circuit uses joint randomness.
    this.RAND_SIZE = this.SHARES * seed * (this.flp.JOINT_RAND_LEN > 0 ? 2 : 1);
    /** @type {Map<number, Uint8Array>} */
    this._dstPrefix = new Map();
    for (let u = 1; u <= 7; u++) this._dstPrefix.set(u, formatDst(0, id, u));
  }

  /**
   * Split `measurement` into SHARES input shares and a public share. Throws
   * MeasurementError on a bad measurement, RangeError on bad argument sizes.
   * @param {Uint8Array} ctx @param {unknown} measurement
   * @param {Uint8Array} nonce @param {Uint8Array} rand
   * @returns {{publicShare: PublicShare, inputShares: InputShare[]}}
   */
  shard(ctx, measurement, nonce, rand) {
    if (nonce.length !== this.NONCE_SIZE) {
      throw new RangeError(`nonce must be ${this.NONCE_SIZE} bytes, got ${nonce.length}`);
    }
    if (rand.length !== this.RAND_SIZE) {
      throw new RangeError(`rand must be ${this.RAND_SIZE} bytes, got ${rand.length}`);
    }
    const size = XofTurboShake128.SEED_SIZE;
    const seeds = [];
    for (let i = 0; i < this.RAND_SIZE; i += size) seeds.push(rand.slice(i, i + size));
    const meas = this.flp.encode(measurement);
    if (this.flp.JOINT_RAND_LEN > 0) return this._shardWithJointRand(ctx, meas, nonce, seeds);
    return this._shardWithoutJointRand(ctx, meas, seeds);
  }

  _shardWithoutJointRand(ctx, meas, seeds) {
    const f = this.field;
    const helperShares = seeds.slice(0, this.SHARES - 1);
    const proveSeed = seeds[this.SHARES - 1];
    let leaderMeasShare = meas;
    helperShares.forEach((share, j) => {
      leaderMeasShare = f.vecSub(leaderMeasShare, this.helperMeasShare(ctx, j + 1, share));
    });
    let leaderProofsShare = this._proveAll(meas, this.proveRands(ctx, proveSeed), null);
    helperShares.forEach((share, j) => {
      leaderProofsShare = f.vecSub(leaderProofsShare, this.helperProofsShare(ctx, j + 1, share));
    });
    /** @type {InputShare[]} */
    const inputShares = [{ measShare: leaderMeasShare, proofsShare: leaderProofsShare, blind: null }];
    for (const share of helperShares) inputShares.push({ share, blind: null });
    return { publicShare: null, inputShares };
  }

  _shardWithJointRand(ctx, meas, nonce, seeds) {
    const f = this.field;
    const nHelpers = this.SHARES - 1;
    const helperShares = [];
    const helperBlinds = [];
    for (let j = 0; j < nHelpers; j++) {
      helperShares.push(seeds[2 * j]);
      helperBlinds.push(seeds[2 * j + 1]);
    }
    const leaderBlind = seeds[2 * nHelpers];
    const proveSeed = seeds[2 * nHelpers + 1];

    let leaderMeasShare = meas;
    const jointRandParts = [];
    for (let j = 0; j < nHelpers; j++) {
      const helperMeasShare = this.helperMeasShare(ctx, j + 1, helperShares[j]);
      leaderMeasShare = f.vecSub(leaderMeasShare, helperMeasShare);
      jointRandParts.push(this.jointRandPart(ctx, j + 1, helperBlinds[j], helperMeasShare, nonce));
    }
    jointRandParts.unshift(this.jointRandPart(ctx, 0, leaderBlind, leaderMeasShare, nonce));

    const jointRands = this.jointRands(ctx, this.jointRandSeed(ctx, jointRandParts));
    let leaderProofsShare = this._proveAll(meas, this.proveRands(ctx, proveSeed), jointRands);
    for (let j = 0; j < nHelpers; j++) {
      leaderProofsShare = f.vecSub(
        leaderProofsShare,
        this.helperProofsShare(ctx, j + 1, helperShares[j]),
      );
    }
    /** @type {InputShare[]} */
    const inputShares = [
      { measShare: leaderMeasShare, proofsShare: leaderProofsShare, blind: leaderBlind },
    ];
    for (let j = 0; j < nHelpers; j++) {
      inputShares.push({ share: helperShares[j], blind: helperBlinds[j] });
    }
    return { publicShare: jointRandParts, inputShares };
  }

  _proveAll(meas, proveRands, jointRands) {
    const flp = this.flp;
    const proofs = [];
    for (let i = 0; i < this.PROOFS; i++) {
      const proveRand = proveRands.slice(i * flp.PROVE_RAND_LEN, (i + 1) * flp.PROVE_RAND_LEN);
      const jointRand =
        jointRands !== null
          ? jointRands.slice(i * flp.JOINT_RAND_LEN, (i + 1) * flp.JOINT_RAND_LEN)
          : [];
      proofs.push(...flp.prove(meas, proveRand, jointRand));
    }
    return proofs;
  }

  // -- derivations -----------------------------------------------------

  /** @param {number} usage @param {Uint8Array} ctx */
  domainSeparationTag(usage, ctx) {
    return concat(/** @type {Uint8Array} */ (this._dstPrefix.get(usage)), ctx);
  }

  helperMeasShare(ctx, aggId, share) {
    return XofTurboShake128.expandIntoVec(
      this.field, share, this.domainSeparationTag(USAGE_MEAS_SHARE, ctx),
      new Uint8Array([aggId]), this.flp.MEAS_LEN,
    );
  }

  helperProofsShare(ctx, aggId, share) {
    return XofTurboShake128.expandIntoVec(
      this.field, share, this.domainSeparationTag(USAGE_PROOF_SHARE, ctx),
      new Uint8Array([this.PROOFS, aggId]), this.flp.PROOF_LEN * this.PROOFS,
    );
  }

  proveRands(ctx, proveSeed) {
    return XofTurboShake128.expandIntoVec(
      this.field, proveSeed, this.domainSeparationTag(USAGE_PROVE_RANDOMNESS, ctx),
      new Uint8Array([this.PROOFS]), this.flp.PROVE_RAND_LEN * this.PROOFS,
    );
  }

  jointRandPart(ctx, aggId, blind, measShare, nonce) {
    return XofTurboShake128.deriveSeed(
      blind, this.domainSeparationTag(USAGE_JOINT_RAND_PART, ctx),
      concat(new Uint8Array([aggId]), nonce, this.field.encodeVec(measShare)),
    );
  }

  jointRandSeed(ctx, jointRandParts) {
    return XofTurboShake128.deriveSeed(
      new Uint8Array(XofTurboShake128.SEED_SIZE),
      this.domainSeparationTag(USAGE_JOINT_RAND_SEED, ctx), concat(...jointRandParts),
    );
  }

  jointRands(ctx, jointRandSeed) {
    return XofTurboShake128.expandIntoVec(
      this.field, jointRandSeed, this.domainSeparationTag(USAGE_JOINT_RANDOMNESS, ctx),
      new Uint8Array([this.PROOFS]), this.flp.JOINT_RAND_LEN * this.PROOFS,
    );
  }

  // -- codec -----------------------------------------------------------

  /** @param {PublicShare} publicShare */
  encodePublicShare(publicShare) {
    return publicShare === null ? new Uint8Array(0) : concat(...publicShare);
  }

  /** @param {InputShare} inputShare */
  encodeInputShare(inputShare) {
    const blind = inputShare.blind ?? new Uint8Array(0);
    if ('measShare' in inputShare) {
      return concat(
        this.field.encodeVec(inputShare.measShare),
        this.field.encodeVec(inputShare.proofsShare),
        blind,
      );
    }
    return concat(inputShare.share, blind);
  }
}

// -- instantiations (Section 7.4) -----------------------------------------

export class Prio3Count extends Prio3 {
  /** @param {number} shares */
  constructor(shares) {
    super(0x00000001, shares, new circuits.Count(Field64), 1);
  }
}

export class Prio3Sum extends Prio3 {
  /** @param {number} shares @param {number|bigint} maxMeasurement */
  constructor(shares, maxMeasurement) {
    super(0x00000002, shares, new circuits.Sum(Field64, maxMeasurement), 1);
  }
}

export class Prio3SumVec extends Prio3 {
  /** @param {number} shares @param {number} length @param {number|bigint} maxMeasurement @param {number} chunkLength */
  constructor(shares, length, maxMeasurement, chunkLength) {
    super(0x00000003, shares, new circuits.SumVec(Field128, length, maxMeasurement, chunkLength), 1);
  }
}

export class Prio3Histogram extends Prio3 {
  /** @param {number} shares @param {number} length @param {number} chunkLength */
  constructor(shares, length, chunkLength) {
    super(0x00000004, shares, new circuits.Histogram(Field128, length, chunkLength), 1);
  }
}

export class Prio3MultihotCountVec extends Prio3 {
  /** @param {number} shares @param {number} length @param {number} maxWeight @param {number} chunkLength */
  constructor(shares, length, maxWeight, chunkLength) {
    super(
      0x00000005, shares,
      new circuits.MultihotCountVec(Field128, length, maxWeight, chunkLength), 1,
    );
  }
}

/** Element-wise sums of `length` non-negative integers whose sum is at most
 * maxValue (draft-ietf-ppm-l1-bound-sum-02). */
export class Prio3L1BoundSum extends Prio3 {
  /** @param {number} shares @param {number} length @param {number|bigint} maxValue @param {number} chunkLength */
  constructor(shares, length, maxValue, chunkLength) {
    super(0x00000007, shares, new circuits.L1BoundSum(Field128, length, maxValue, chunkLength), 1);
  }
}

/** Prio3SumVec with several proofs over a smaller field (Section 7.4.5);
 * 0xFFFFFFFF is the draft's test-only codepoint. */
export class Prio3SumVecWithMultiproof extends Prio3 {
  constructor(shares, field, numProofs, length, maxMeasurement, chunkLength) {
    super(
      0xffffffff, shares,
      new circuits.SumVec(field, length, maxMeasurement, chunkLength), numProofs,
    );
  }
}

/**
 * The Prio3 instance of a task's [vdaf] table for two aggregators, as
 * veil.task.VdafSpec.instantiate builds it.
 * @param {{type: string, max_measurement?: number, length?: number, chunk_length?: number, max_weight?: number, max_value?: number}} spec
 * @returns {Prio3}
 */
export function prio3FromSpec(spec) {
  switch (spec.type) {
    case 'count':
      return new Prio3Count(2);
    case 'sum':
      return new Prio3Sum(2, spec.max_measurement ?? 0);
    case 'sumvec':
      return new Prio3SumVec(2, spec.length ?? 0, spec.max_measurement ?? 0, spec.chunk_length ?? 0);
    case 'histogram':
      return new Prio3Histogram(2, spec.length ?? 0, spec.chunk_length ?? 0);
    case 'multihot':
      return new Prio3MultihotCountVec(2, spec.length ?? 0, spec.max_weight ?? 0, spec.chunk_length ?? 0);
    case 'l1boundsum':
      return new Prio3L1BoundSum(2, spec.length ?? 0, spec.max_value ?? 0, spec.chunk_length ?? 0);
    default:
      throw new RangeError(`unknown VDAF type ${JSON.stringify(spec.type)}`);
  }
}
