// The fully linear proof system of BBCGGI19 (Theorem 4.3), as specified in
// draft-irtf-cfrg-vdaf-18, Section 7.3 (veil.vdaf.flp). The client only
// proves; query and decide run on the aggregators (Python).
//
// For each gadget called M times the prover builds one wire polynomial per
// gadget input, of degree < P = nextPowerOf2(1 + M): its value at alpha^0 is
// a random seed and at alpha^k the input of the k-th call. The proof holds the
// seeds and the gadget polynomial G(x) = gadget(wires(x)) as its first
// DEGREE * (P - 1) + 1 values on the next power-of-two domain.

import { invNtt, nextPowerOf2, ntt } from './poly.js';

/** @typedef {import('./field.js').Field} Field */

/** Values per wire polynomial: the seed plus one per call, rounded up. */
export function wirePolyLen(gadgetCalls) {
  return nextPowerOf2(1 + gadgetCalls);
}

/** Values of the gadget polynomial carried in the proof. */
export function gadgetPolyLen(degree, wireLen) {
  return degree * (wireLen - 1) + 1;
}

/** The FLP for a validity circuit. Lengths follow the draft's names. */
export class FlpBBCGGI19 {
  /** @param {any} valid a circuit from circuits.js */
  constructor(valid) {
    this.valid = valid;
    this.field = /** @type {Field} */ (valid.field);
    this.layouts = valid.GADGETS.map((g, i) => {
      const calls = valid.GADGET_CALLS[i];
      const wireLen = wirePolyLen(calls);
      const polyLen = gadgetPolyLen(g.DEGREE, wireLen);
      const domain = nextPowerOf2(polyLen);
      if (this.field.GEN_ORDER % BigInt(domain) !== 0n) {
        throw new RangeError("circuit too large for the field's roots of unity");
      }
      return { gadget: g, calls, wireLen, polyLen, domain };
    });
    this.MEAS_LEN = valid.MEAS_LEN;
    this.OUTPUT_LEN = valid.OUTPUT_LEN;
    this.JOINT_RAND_LEN = valid.JOINT_RAND_LEN;
    this.PROVE_RAND_LEN = valid.GADGETS.reduce((n, g) => n + g.ARITY, 0);
    this.QUERY_RAND_LEN =
      valid.GADGETS.length + (valid.EVAL_OUTPUT_LEN > 1 ? valid.EVAL_OUTPUT_LEN : 0);
    this.PROOF_LEN = this.layouts.reduce((n, l) => n + l.gadget.ARITY + l.polyLen, 0);
    this.VERIFIER_LEN = 1 + valid.GADGETS.reduce((n, g) => n + g.ARITY + 1, 0);
  }

  /** @param {unknown} measurement @returns {bigint[]} */
  encode(measurement) {
    return this.valid.encode(measurement);
  }

  /**
   * Pre: meas has MEAS_LEN, proveRand PROVE_RAND_LEN and jointRand
   * JOINT_RAND_LEN elements. Post: PROOF_LEN elements.
   * @param {bigint[]} meas @param {bigint[]} proveRand @param {bigint[]} jointRand
   * @returns {bigint[]}
   */
  prove(meas, proveRand, jointRand) {
    checkLen('measurement', meas, this.MEAS_LEN);
    checkLen('prove randomness', proveRand, this.PROVE_RAND_LEN);
    checkLen('joint randomness', jointRand, this.JOINT_RAND_LEN);
    const field = this.field;
    let offset = 0;
    // Each gadget call is recorded: wires[j][k] is input j of call k.
    const recorders = this.layouts.map((lay) => {
      const seeds = proveRand.slice(offset, offset + lay.gadget.ARITY);
      offset += lay.gadget.ARITY;
      const wires = seeds.map((s) => {
        const w = new Array(lay.wireLen).fill(0n);
        w[0] = s;
        return w;
      });
      let calls = 0;
      /** @type {(inp: bigint[]) => bigint} */
      const call = (inp) => {
        calls += 1;
        for (let j = 0; j < wires.length; j++) wires[j][calls] = inp[j];
        return lay.gadget.eval(field, inp);
      };
      return { wires, call };
    });
    this.valid.eval(meas, jointRand, 1, recorders.map((r) => r.call));

    /** @type {bigint[]} */
    const proof = [];
    this.layouts.forEach((lay, i) => {
      const { wires } = recorders[i];
      for (const wire of wires) proof.push(wire[0]);
      // Each wire's values on the larger domain where G is determined.
      const wireValues = wires.map((wire) => ntt(field, invNtt(field, wire), lay.domain));
      const g = lay.gadget.evalPoly(field, wireValues);
      for (let k = 0; k < lay.polyLen; k++) proof.push(g[k]);
    });
    return proof;
  }
}

function checkLen(what, vec, expected) {
  if (vec.length !== expected) {
    throw new RangeError(`${what}: expected ${expected} elements, got ${vec.length}`);
  }
}
