// Gadgets of the BBCGGI19 FLP (draft-irtf-cfrg-vdaf-18, Section 7.3.4;
// veil.vdaf.gadgets). A gadget is the non-affine piece of a validity circuit.
// Polynomials are kept in the Lagrange basis, so evaluating a gadget on
// polynomials is evaluating it point by point on their values (evalPoly).

/** @typedef {import('./field.js').Field} Field */

class Gadget {
  /**
   * @param {Field} field
   * @param {bigint[][]} inpPolys ARITY polynomials' values on a common domain
   * @returns {bigint[]}
   */
  evalPoly(field, inpPolys) {
    if (inpPolys.length !== this.ARITY) {
      throw new RangeError(`expected ${this.ARITY} input polynomials, got ${inpPolys.length}`);
    }
    const n = inpPolys[0].length;
    const out = new Array(n);
    const column = new Array(this.ARITY);
    for (let k = 0; k < n; k++) {
      for (let j = 0; j < this.ARITY; j++) column[j] = inpPolys[j][k];
      out[k] = this.eval(field, column);
    }
    return out;
  }
}

/** x * y. */
export class Mul extends Gadget {
  ARITY = 2;
  DEGREE = 2;

  /** @param {Field} field @param {bigint[]} inp */
  eval(field, inp) {
    return (inp[0] * inp[1]) % field.MODULUS;
  }
}

/** A fixed univariate polynomial, coefficients lowest degree first. */
export class PolyEval extends Gadget {
  ARITY = 1;

  /** @param {(number|bigint)[]} coeffs (negative ones are reduced in the field) */
  constructor(coeffs) {
    super();
    const stripped = coeffs.map(BigInt);
    while (stripped.length && stripped[stripped.length - 1] === 0n) stripped.pop();
    if (!stripped.length) throw new RangeError('PolyEval needs a non-zero polynomial');
    this.coeffs = stripped;
    this.DEGREE = stripped.length - 1;
  }

  /** @param {Field} field @param {bigint[]} inp */
  eval(field, inp) {
    const x = inp[0];
    let acc = 0n;
    for (let i = this.coeffs.length - 1; i >= 0; i--) acc = field.reduce(acc * x + this.coeffs[i]);
    return acc;
  }
}

/** Sum of `count` evaluations of `subcircuit` on consecutive input slices
 * (BBCGGI19, Section 4.4): fewer gadget calls, shorter proofs. */
export class ParallelSum extends Gadget {
  /** @param {Gadget & {ARITY: number, DEGREE: number}} subcircuit @param {number} count */
  constructor(subcircuit, count) {
    super();
    if (count < 1) throw new RangeError('ParallelSum count must be at least 1');
    this.subcircuit = subcircuit;
    this.count = count;
    this.ARITY = subcircuit.ARITY * count;
    this.DEGREE = subcircuit.DEGREE;
  }

  /** @param {Field} field @param {bigint[]} inp */
  eval(field, inp) {
    const arity = this.subcircuit.ARITY;
    let total = 0n;
    for (let i = 0; i < this.ARITY; i += arity) {
      total += this.subcircuit.eval(field, inp.slice(i, i + arity));
    }
    return total % field.MODULUS;
  }
}
