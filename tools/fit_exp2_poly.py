#!/usr/bin/env python3
"""The coefficients of bp::math::exp2_poly (reference/numerics/math.h, SPEC.md §2.2).

p(f) = 1 + c1·f + … + c6·f^6 approximates 2^f on [0, 1] in relative error. The fit is
a Remez exchange in 200-bit arithmetic (mpmath; Debian's python3-mpmath). The
coefficients are then rounded to binary32 one at a time, lowest degree first, and
the higher ones refitted after each rounding (so each later coefficient absorbs the
earlier ones' rounding). The script prints them as the C++ hex-float literals of
math.h, the real minimax error, and checks that the fp32 Horner evaluation gives
p(0) = 1 and p(1) = 2 exactly, which exp2_poly's monotonicity needs.

    tools/fit_exp2_poly.py [--centered] [DEGREE]     (about a minute)

--centered fits on [−1/2, 1/2] instead, the interval of a split of t by rounding to
nearest (no −1/2 FADD): the form contract v3 considers (bench/DECISIONS.md, "exp2
without the −½ FADD"); its check is then p(1/2) against 2·p(−1/2), the boundary
between two exponents. The accuracy that counts is measured over all 2^32 inputs by
`tools/ulp_scan exp2_poly`, and a polynomial's order over its interval by
`tools/exp2_poly_scan`.
"""
import sys

import mpmath as mp

mp.mp.prec = 200
CENTERED = "--centered" in sys.argv[1:]
DEGREE = int(next((a for a in sys.argv[1:] if a.isdigit()), 6))
LO, HI = (mp.mpf(-0.5), mp.mpf(0.5)) if CENTERED else (mp.mpf(0), mp.mpf(1))
GRID = 4000  # points per error scan when looking for the extrema
ITERATIONS = 30


def to_f32(v):
    """v rounded to the nearest binary32 (normal range), ties to even."""
    v = mp.mpf(v)
    if v == 0:
        return mp.mpf(0)
    ulp = mp.mpf(2) ** (mp.floor(mp.log(abs(v), 2)) - 23)
    q = v / ulp
    r = mp.floor(q)
    if q - r > 0.5 or (q - r == 0.5 and int(r) % 2 == 1):
        r += 1
    return r * ulp


def rel_error(c, x):
    t = mp.mpf(2) ** x
    return (1 + sum(v * x**k for k, v in c.items()) - t) / t


def remez(fixed):
    """Minimax in relative error of 2^x by 1 + Σ c_k x^k with the `fixed` c_k given."""
    free = [k for k in range(1, DEGREE + 1) if k not in fixed]
    n = len(free)
    ref = [(LO + HI) / 2 + (HI - LO) / 2 * mp.cos(mp.pi * (n - i) / n) for i in range(n + 1)]
    worst = None
    for _ in range(ITERATIONS):
        rows, rhs = [], []
        for i, x in enumerate(ref):
            t = mp.mpf(2) ** x
            rows.append([x**k for k in free] + [(-1) ** i * t])
            rhs.append(t - 1 - sum(v * x**k for k, v in fixed.items()))
        sol = mp.lu_solve(mp.matrix(rows), mp.matrix(rhs))
        c = dict(fixed)
        c.update({k: sol[j] for j, k in enumerate(free)})
        grid = [LO + (HI - LO) * i / GRID for i in range(GRID + 1)]
        errs = [rel_error(c, x) for x in grid]
        worst = max(abs(e) for e in errs)
        # Local extrema of |error|, then one per sign run, the n+1 largest.
        ext = [grid[i] for i in range(GRID + 1)
               if (i == 0 or abs(errs[i]) >= abs(errs[i - 1])) and (i == GRID or abs(errs[i]) >= abs(errs[i + 1]))]
        alt = []
        for x in ext:
            if alt and mp.sign(rel_error(c, x)) == mp.sign(rel_error(c, alt[-1])):
                if abs(rel_error(c, x)) > abs(rel_error(c, alt[-1])):
                    alt[-1] = x
            else:
                alt.append(x)
        while len(alt) > n + 1:
            alt.pop(0 if abs(rel_error(c, alt[0])) < abs(rel_error(c, alt[-1])) else -1)
        if len(alt) == n + 1:
            ref = alt
    return c, worst


def f32_literal(v):
    """A binary32 value as math.h writes it: 0x1.hhhhhhp±e with six hex digits."""
    mantissa, exponent = float(v).hex().split("p")
    return f"{mantissa[:10]}p{exponent}f"


def horner_f32(c, f):
    p = c[DEGREE]
    for k in range(DEGREE - 1, 0, -1):
        p = to_f32(p * f + c[k])  # one fma: exact product and sum, one rounding
    return to_f32(p * f + 1)


def main():
    c, err = remez({})
    print(f"minimax relative error {mp.nstr(err, 5)} = {mp.nstr(err * 2**24, 4)} x 2^-24")
    fixed = {}
    for k in range(1, DEGREE + 1):
        fixed[k] = to_f32(c[k])
        if k < DEGREE:
            c, err = remez(fixed)
    if CENTERED:
        lo, hi = horner_f32(fixed, LO), horner_f32(fixed, HI)
        print(f"fp32 Horner: p(-1/2) = {lo}, p(1/2) = {hi}" + ("" if hi <= 2 * lo else "  (p(1/2) > 2 p(-1/2))"))
    else:
        p0, p1 = horner_f32(fixed, mp.mpf(0)), horner_f32(fixed, mp.mpf(1))
        print(f"fp32 Horner: p(0) = {p0}, p(1) = {p1}" + ("" if (p0, p1) == (1, 2) else "  (NOT 1 and 2)"))
    print(", ".join(f"c{k} = {f32_literal(fixed[k])}" for k in range(1, DEGREE + 1)))


if __name__ == "__main__":
    main()
