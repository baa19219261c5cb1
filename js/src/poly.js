// Polynomials over NTT-friendly fields, in the Lagrange basis (veil.vdaf.poly).
//
// The FLP of draft-irtf-cfrg-vdaf-18 (Section 7.3) represents every
// polynomial by its values at successive powers of a primitive n-th root of
// unity w: [P(w^0), P(w^1), ...]. The client needs only the NTT and its
// inverse, to move a wire's values onto the gadget polynomial's larger domain.

/** The smallest power of two that is >= n (n >= 1). @param {number} n */
export function nextPowerOf2(n) {
  let p = 1;
  while (p < n) p *= 2;
  return p;
}

/**
 * [P(w^i) for i < n] for P with the given coefficients (at most n),
 * w the field's primitive n-th root.
 * @param {import('./field.js').Field} field
 * @param {bigint[]} coeffs
 * @param {number} n
 * @returns {bigint[]}
 */
export function ntt(field, coeffs, n) {
  if (coeffs.length > n) {
    throw new RangeError(`${coeffs.length} coefficients do not fit a size-${n} NTT`);
  }
  const p = field.MODULUS;
  const a = coeffs.concat(new Array(n - coeffs.length).fill(0n));
  // Bit-reversal permutation, then iterative Cooley-Tukey butterflies.
  for (let i = 1, j = 0; i < n; i++) {
    let bit = n >> 1;
    while (j & bit) {
      j ^= bit;
      bit >>= 1;
    }
    j |= bit;
    if (i < j) [a[i], a[j]] = [a[j], a[i]];
  }
  const roots = field.nodes(n); // w^k for the size-n root; size s uses every (n/s)-th
  for (let size = 2; size <= n; size <<= 1) {
    const half = size >> 1;
    const stride = n / size;
    for (let start = 0; start < n; start += size) {
      for (let k = 0; k < half; k++) {
        const u = a[start + k];
        const v = (a[start + k + half] * roots[k * stride]) % p;
        const s = u + v;
        a[start + k] = s >= p ? s - p : s;
        const d = u - v;
        a[start + k + half] = d < 0n ? d + p : d;
      }
    }
  }
  return a;
}

/**
 * Coefficients of the polynomial of degree < n taking `values` at the n-th
 * roots of unity (n = values.length, a power of two).
 * @param {import('./field.js').Field} field
 * @param {bigint[]} values
 * @returns {bigint[]}
 */
export function invNtt(field, values) {
  const n = values.length;
  const p = field.MODULUS;
  const out = ntt(field, values, n);
  const nInv = field.inv(BigInt(n));
  // Evaluating at w^-i is evaluating at w^(n-i): reverse all but the first.
  const coeffs = [(out[0] * nInv) % p];
  for (let i = n - 1; i >= 1; i--) coeffs.push((out[i] * nInv) % p);
  return coeffs;
}
