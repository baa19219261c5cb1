"""The BBCGGI19 FLP of draft-irtf-cfrg-vdaf-18, Section 7.3, over a batch of
reports: ``prove``, ``query`` and ``decide`` as in ``veil.vdaf.spec.flp``, with
one row per report in every argument and result.

Per-circuit constants are computed once per instance: the roots of unity
of each gadget's domain and the prefix-extension rows. The query point
``t`` differs per report, so the barycentric weights are computed per
report, vectorised across the batch: the ``D`` differences ``t - w^i`` are
inverted with Montgomery's trick (one modular inversion per report), and
the wire domain's weights reuse them (its roots are every ``D/P``-th root
of the gadget domain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from veil.vdaf.batch.circuits import BatchCircuit, batch_circuit, gadget_eval
from veil.vdaf.batch.field import Arr, VecField, VecField128, vec_field
from veil.vdaf.batch.kernels import kernels
from veil.vdaf.spec.flp import FlpBBCGGI19
from veil.vdaf.spec.gadgets import Gadget, Mul, ParallelSum
from veil.vdaf.spec.poly import PrefixExtension, inv_ntt, ntt


@dataclass(frozen=True)
class _Layout:
    gadget: Gadget
    calls: int
    wire_len: int  # P
    poly_len: int
    domain: int  # D
    nodes: Arr  # w_D^i, i < D
    ext_rows: Arr  # (D - poly_len, poly_len): the missing values of G
    extend: _Extension
    root_levels: list[Arr]  # level l: w_D^(2^l i) for i < D / 2^l


class _Ntt:
    """Radix-2 NTT of size ``n`` along the last axis, vectorised over all
    other axes: bit-reversal, then ``log2 n`` butterfly stages."""

    def __init__(self, vf: type[VecField], n: int) -> None:
        self.vf = vf
        self.n = n
        bits = n.bit_length() - 1
        self.perm = np.array(
            [int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(n)], dtype=np.intp
        )
        field = vf.field
        p = field.MODULUS
        self.twiddles = []
        size = 2
        while size <= n:
            w = field.root_of_unity(size)
            self.twiddles.append(vf.from_ints([pow(w, k, p) for k in range(size // 2)]))
            size <<= 1

    def __call__(self, a: Arr) -> Arr:
        vf = self.vf
        n = self.n
        lead = vf.elem_shape(a)[:-1]
        a = a[..., self.perm]
        size = 2
        for tw in self.twiddles:
            half = size // 2
            blocks = vf.reshape(a, (*lead, n // size, size))
            u = blocks[..., :half]
            v = vf.mul(blocks[..., half:], tw)
            a = vf.reshape(vf.concat([vf.add(u, v), vf.sub(u, v)]), (*lead, n))
            size <<= 1
        return a


class _Extension:
    """Values of polynomials of degree ``< P`` at the P-th roots of unity to
    their values at the D-th roots (``D = s P``, last axis). The roots
    ``w_D^(i s + c)`` form s cosets; coset 0 is the input. The others are a
    fixed linear map E of the input, computed by the cheapest of:

    - an NTT: inverse NTT, twist by ``w_D^(c k) / P``, NTT (any field);
    - for Field128, the product with E row by row in a compiled kernel
      (``kernels.matvec128``) that skips zero entries and takes small ones
      (the prover's bits and ``x - 1``) at a quarter of the cost: for small
      P, and for wide wires that are mostly zero past the seed (``r^j x`` on
      a one-hot vector);
    - for wide Field128 wires whose values past the seed are small
      integers (``x - 1`` on a one-hot vector): a GEMM with E's limbs only,
      exact in float64, plus ``seed * E[0]``.
    """

    MATRIX_MAX = 32
    SMALL = 1 << 15

    def __init__(self, vf: type[VecField], wire_len: int, domain: int) -> None:
        self.vf = vf
        self.wire_len = wire_len
        self.domain = domain
        self.ntt = _Ntt(vf, wire_len)
        p = vf.MODULUS
        w = vf.field.root_of_unity(domain)
        n_inv = pow(wire_len, -1, p)
        self.twists = [
            vf.from_ints([pow(w, c * k, p) * n_inv % p for k in range(wire_len)])
            for c in range(1, domain // wire_len)
        ]
        # Inverse NTT = forward NTT, then reverse all but the first entry.
        self.reverse = np.array([0, *range(wire_len - 1, 0, -1)], dtype=np.intp)
        self.rows: Arr | None = None
        if vf is VecField128 and self.twists:
            field = vf.field
            rows = []
            s = domain // wire_len
            for k in range(wire_len):
                unit = [0] * wire_len
                unit[k] = 1
                on_domain = ntt(field, inv_ntt(field, unit), domain)
                rows.append([on_domain[i * s + c] for c in range(1, s) for i in range(wire_len)])
            self.rows = np.ascontiguousarray(vf.from_ints(rows))  # (P, J)
            # Where column (c - 1) P + i of E goes on the domain: i s + c.
            self.dest = np.array(
                [i * s + c for c in range(1, s) for i in range(wire_len)], dtype=np.int64
            )
            obj = np.array(rows, dtype=object)
            self.row_limbs = np.stack(
                [((obj >> (16 * b)) & 0xFFFF).astype(np.float64) for b in range(8)], axis=-1
            ).reshape(wire_len, -1)  # (P, J * 8)

    def __call__(self, values: Arr) -> Arr:
        vf = self.vf
        if not self.twists:
            return values
        p_len = self.wire_len
        lead = vf.elem_shape(values)[:-1]
        flat = vf.reshape(values, (-1, p_len))
        out = self._others(flat)
        cosets = [flat] + [out[..., c * p_len : (c + 1) * p_len] for c in range(len(self.twists))]
        stacked = vf.stack(cosets, axis=-1)  # (R, P, s)
        return vf.reshape(stacked, (*lead, self.domain))

    def of_wires(self, seeds: Arr, wires: Arr) -> Arr | None:
        """``self(polys)`` for the polys a prover builds from ``seeds``
        ``(rows, ARITY)`` and ``wires`` ``(rows, ARITY, C)`` (a seed, then
        one value per call, then zeros): in one pass of a compiled kernel
        for the Field128 wires up to MATRIX_MAX long, None otherwise."""
        vf = self.vf
        if vf is not VecField128 or self.rows is None or self.wire_len > self.MATRIX_MAX:
            return None
        rows, arity, calls = vf.elem_shape(wires)
        if calls >= self.wire_len:
            return None
        out = np.empty((4, rows, arity, self.domain), dtype=np.int64)
        kernels().extend128(seeds, wires, self.rows, self.dest, out)
        return out

    def mul_sum_of_wires(self, seeds: Arr, wires: Arr, poly_len: int) -> Arr | None:
        """The ParallelSum(Mul) gadget polynomial ``(rows, poly_len)`` of the
        wires `of_wires` extends, in one compiled pass that keeps each row's
        extended wires in a buffer of its own; None where `of_wires` is."""
        vf = self.vf
        if vf is not VecField128 or self.rows is None or self.wire_len > self.MATRIX_MAX:
            return None
        rows, arity, calls = vf.elem_shape(wires)
        if calls >= self.wire_len or arity % 2 or poly_len > self.domain:
            return None
        out = np.empty((4, rows, poly_len), dtype=np.int64)
        kernels().prove_mul_sum128(seeds, wires, self.rows, self.dest, out)
        return out

    def _generic(self, flat: Arr) -> Arr:
        vf = self.vf
        coeffs_unscaled = self.ntt(flat)[..., self.reverse]
        return vf.concat([self.ntt(vf.mul(coeffs_unscaled, tw)) for tw in self.twists])

    def _matvec(self, flat: Arr) -> Arr:
        assert self.rows is not None
        out = np.empty((4, flat.shape[1], self.rows.shape[-1]), dtype=np.int64)
        kernels().matvec128(np.ascontiguousarray(flat), self.rows, out)
        return out

    def _others(self, flat: Arr) -> Arr:
        """``(R, P)`` values to the ``(R, J)`` values on cosets ``1 .. s-1``."""
        vf = self.vf
        if vf is not VecField128 or self.rows is None:
            return self._generic(flat)
        if self.wire_len <= self.MATRIX_MAX:
            return self._matvec(flat)
        # Wide wires: the kernel's cost grows with the non-zero entries, so
        # rows of small values go to a float GEMM on E's limbs and dense
        # rows to the NTT.
        rows_e = self.rows
        count = flat.shape[1]
        rest = vf.concat([vf.zeros((count, 1)), flat[..., 1:]])
        small_pos, small_neg, neg0 = _small_signed(rest, self.SMALL)
        small_rows = np.all(small_pos | small_neg, axis=-1)
        result = np.empty((4, count, rows_e.shape[-1]), dtype=np.int64)
        big = np.flatnonzero(~small_rows)
        if big.size:
            dense = flat[:, big]
            nonzero = int((~vf.is_zero(rest[:, big])).sum())
            if nonzero <= big.size * max(1, self.wire_len.bit_length() - 1):
                result[:, big] = self._matvec(dense)
            else:
                result[:, big] = self._generic(dense)
        idx = np.flatnonzero(small_rows)
        if idx.size:
            signed = np.where(small_pos[idx], rest[0][idx], -neg0[idx]).astype(np.float64)
            sums = (signed @ self.row_limbs).reshape(idx.size, -1, 8).astype(np.int64)
            part = VecField128._normalize(
                *[sums[..., 2 * k] + (sums[..., 2 * k + 1] << 16) for k in range(4)]
            )
            seeds = vf.mul(flat[:, idx, 0:1], rows_e[..., 0, :])
            result[:, idx] = vf.add(seeds, part)
        return result


def _small_signed(a: Arr, bound: int) -> tuple[Arr, Arr, Arr]:
    """Which Field128 elements are ``v`` or ``p - v`` for ``0 <= v < bound``
    (two masks), and the low limb of ``p - a``. Cheap and conservative: a
    small value held as ``v + p`` (weakly reduced) counts as not small."""
    small_pos = (a[1] == 0) & (a[2] == 0) & (a[3] == 0) & (a[0] < bound)
    # p - a, limb by limb with signed borrows; small iff it is below bound.
    d0 = 1 - a[0]
    d1 = -a[1] + (d0 >> 32)
    d2 = 0xFFFFFFE4 - a[2] + (d1 >> 32)
    d3 = 0xFFFFFFFF - a[3] + (d2 >> 32)
    low = d0 & 0xFFFFFFFF
    small_neg = (d1 & 0xFFFFFFFF == 0) & (d2 & 0xFFFFFFFF == 0) & (d3 == 0) & (low < bound)
    return small_pos, small_neg, low


def _inverse_differences(
    vf: type[VecField], t: Arr, root_levels: list[Arr]
) -> tuple[Arr, list[Arr]]:
    """``1 / (t - w^i)`` for the D-th roots of unity ``w^i`` (``(rows, D)``,
    zero where ``t^D = 1``) and ``[t, t^2, t^4, ..., t^D]``.

    Montgomery's trick on a product tree that costs nothing to build:
    pairing ``w^i`` with ``w^(i + D/2) = -w^i`` gives ``t^2 - w^(2i)``, so
    level l holds ``t^(2^l) - u`` over the ``D/2^l``-th roots ``u`` and the
    root is ``t^D - 1``. Only the descent multiplies: two per node.
    """
    t_pows = [t]
    for _ in root_levels:
        t_pows.append(vf.mul(t_pows[-1], t_pows[-1]))
    inv = vf.inv_each(vf.sub(t_pows[-1], vf.constant(1)))
    if vf is VecField128 and root_levels and vf.elem_shape(t) == vf.elem_shape(inv) == t.shape[1:2]:
        # Compiled: one pass per row instead of two NumPy products and a
        # subtraction per level over the whole batch (Histogram(100,10)'s
        # 32 roots: 5.2 -> 1.6 us a report with the inversion; the same
        # limbs).
        nodes = np.ascontiguousarray(root_levels[0])
        out = np.empty((4, t.shape[1], nodes.shape[1]), dtype=np.int64)
        kernels().inverse_differences128(vf.stack(t_pows[:-1]), inv, nodes, out)
        return out, t_pows
    inv = inv[..., None]
    levels = [vf.sub(t_pows[lvl][..., None], roots) for lvl, roots in enumerate(root_levels)]
    for level in reversed(levels):
        half = vf.elem_shape(level)[-1] // 2
        inv = vf.concat([vf.mul(inv, level[..., half:]), vf.mul(inv, level[..., :half])])
    return inv, t_pows


class BatchFlp:
    """``FlpBBCGGI19`` over a batch; lengths and names as in the scalar one."""

    def __init__(self, flp: FlpBBCGGI19[Any, Any], lifted: bool = False) -> None:
        self.flp = flp
        self.valid = flp.valid
        self.vf: type[VecField] = vec_field(flp.field)
        self.circuit: BatchCircuit = batch_circuit(flp.valid, lifted)
        field = flp.field
        p = field.MODULUS
        self.layouts = []
        for lay in flp.layouts:
            w = field.root_of_unity(lay.domain)
            nodes = [pow(w, i, p) for i in range(lay.domain)]
            ext = PrefixExtension(field, lay.poly_len)
            rows = ext._rows
            self.layouts.append(
                _Layout(
                    gadget=lay.gadget,
                    calls=lay.calls,
                    wire_len=lay.wire_len,
                    poly_len=lay.poly_len,
                    domain=lay.domain,
                    nodes=self.vf.from_ints(nodes),
                    ext_rows=self.vf.from_ints(rows) if rows else self.vf.zeros((0, lay.poly_len)),
                    extend=_Extension(self.vf, lay.wire_len, lay.domain),
                    root_levels=[
                        self.vf.from_ints(nodes[:: 1 << lvl][: lay.domain >> lvl])
                        for lvl in range(lay.domain.bit_length() - 1)
                    ],
                )
            )

    # -- prove -------------------------------------------------------------

    def _wire_polys(self, seeds: Arr, wires: Arr, wire_len: int) -> Arr:
        """``(rows, ARITY, P)``: seed, then one value per call, then zeros."""
        vf = self.vf
        rows, arity, calls = vf.elem_shape(wires)
        parts = [seeds[..., None], wires]
        if wire_len - 1 - calls:
            parts.append(vf.zeros((rows, arity, wire_len - 1 - calls)))
        return vf.concat(parts)

    def prove(self, meas: Arr, prove_rand: Arr, joint_rand: Arr) -> Arr:
        """``(rows, PROOF_LEN)`` from ``(rows, MEAS_LEN)``,
        ``(rows, PROVE_RAND_LEN)`` and ``(rows, JOINT_RAND_LEN)``."""
        vf = self.vf
        wires, _ = self.circuit.eval(meas, joint_rand, 1, None)
        parts = []
        offset = 0
        for lay, w in zip(self.layouts, wires, strict=True):
            arity = lay.gadget.ARITY
            seeds = prove_rand[..., offset : offset + arity]
            offset += arity
            g = None
            if isinstance(lay.gadget, ParallelSum) and isinstance(lay.gadget.subcircuit, Mul):
                g = lay.extend.mul_sum_of_wires(seeds, w, lay.poly_len)
            if g is None:
                on_domain = lay.extend.of_wires(seeds, w)  # (rows, ARITY, D)
                if on_domain is None:
                    on_domain = lay.extend(self._wire_polys(seeds, w, lay.wire_len))
                g = gadget_eval(vf, lay.gadget, on_domain)[..., : lay.poly_len]
            parts += [seeds, g]
        return vf.concat(parts)

    # -- query -------------------------------------------------------------

    def query(
        self, meas: Arr, proof: Arr, query_rand: Arr, joint_rand: Arr, num_shares: int
    ) -> tuple[Arr, Arr, Arr]:
        """The verifier shares ``(rows, VERIFIER_LEN)``, a mask of reports
        whose query point is a root of unity of a wire domain (rejected, as
        the scalar ``query`` raises), and a mask of reports whose point is a
        root of unity of a gadget domain only: their weights here are wrong
        and the caller must recompute them with the scalar FLP."""
        vf = self.vf
        rows = vf.elem_shape(meas)[0]
        offset = 0
        seeds_all = []
        g_all = []
        outputs = []
        for lay in self.layouts:
            arity = lay.gadget.ARITY
            seeds = proof[..., offset : offset + arity]
            offset += arity
            g = proof[..., offset : offset + lay.poly_len]
            offset += lay.poly_len
            if lay.domain > lay.poly_len:
                missing = vf.dot(g[..., None, :], lay.ext_rows)  # (rows, D - poly_len)
                g = vf.concat([g, missing])
            step = lay.domain // lay.wire_len
            outputs.append(g[..., step : step * (lay.calls + 1) : step])
            seeds_all.append(seeds)
            g_all.append(g)

        # Lagrange weights of each gadget's query point, then the wires.
        e = self.valid.EVAL_OUTPUT_LEN
        points = query_rand[..., e:] if e > 1 else query_rand
        bad = np.zeros(rows, dtype=bool)
        node_hit = np.zeros(rows, dtype=bool)
        one = vf.constant(1)
        wire_weights = []
        g_evals = []
        for i, lay in enumerate(self.layouts):
            t = points[..., i]
            d = lay.domain
            p_len = lay.wire_len
            step = d // p_len
            diff_inv, t_pows = _inverse_differences(vf, t, lay.root_levels)
            t_p = t_pows[p_len.bit_length() - 1]
            t_d = t_pows[-1]
            bad |= vf.eq(t_p, one)
            node_hit |= vf.eq(t_d, one) & ~vf.eq(t_p, one)
            # l_i(t) = (t^n - 1) / n * w^i / (t - w^i) on each domain; the
            # D-domain's scale is applied once, after the sum.
            base = vf.mul(lay.nodes, diff_inv)
            scale_d = vf.mul(vf.sub(t_d, one), vf.constant(pow(d, -1, vf.MODULUS)))
            scale_p = vf.mul(vf.sub(t_p, one), vf.constant(pow(p_len, -1, vf.MODULUS)))
            wire_weights.append(vf.mul(base[..., ::step], scale_p[..., None]))
            g_evals.append(vf.mul(vf.dot(g_all[i], base), scale_d))

        shortcut = self.circuit.wire_evals(
            meas, joint_rand, num_shares, outputs, seeds_all, wire_weights
        )
        if shortcut is not None:
            wire_evals, out = shortcut
        else:
            wires, maybe_out = self.circuit.eval(meas, joint_rand, num_shares, outputs)
            assert maybe_out is not None
            out = maybe_out
            wire_evals = [
                vf.dot(self._wire_polys(seeds, w, lay.wire_len), weights[..., None, :])
                for seeds, w, lay, weights in zip(
                    seeds_all, wires, self.layouts, wire_weights, strict=True
                )
            ]
        v = vf.dot(query_rand[..., :e], out) if e > 1 else out[..., 0]
        parts = [v[..., None]]
        for evals, g_t in zip(wire_evals, g_evals, strict=True):
            parts += [evals, g_t[..., None]]
        return vf.concat(parts), bad, node_hit

    def decide(self, verifier: Arr) -> Arr:
        """A boolean mask: which combined verifiers accept."""
        vf = self.vf
        ok = vf.is_zero(verifier[..., 0])
        offset = 1
        for lay in self.layouts:
            arity = lay.gadget.ARITY
            checks = verifier[..., offset : offset + arity]
            gadget_check = verifier[..., offset + arity]
            offset += arity + 1
            value = gadget_eval(vf, lay.gadget, checks[..., None])[..., 0]
            ok &= vf.eq(value, gadget_check)
        return np.asarray(ok)
