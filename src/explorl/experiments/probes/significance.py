"""Significance tests of two success rates: Fisher's exact test and the two-proportion z-test (the ERPO
perturbation probe, Figure 1(b), compares the high- and low-entropy positions with them)."""

from __future__ import annotations

import math


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact test of the 2x2 table `[[a, b], [c, d]]` (rows: groups, columns: success / failure).

    With the margins fixed, the count in cell a is hypergeometric: `P(x) = C(a+b, x) C(c+d, a+c-x) / C(n, a+c)`.
    The p-value sums `P(x)` over every x no more probable than the observed a, with exact integer arithmetic
    (`math.comb`), so ties are never lost to rounding. Tea tasting, `[[3, 1], [1, 3]]`: (16 + 16 + 1 + 1) / 70.
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"fisher_exact: counts must be >= 0, got {(a, b, c, d)}")
    r1, r2, c1 = a + b, c + d, a + c
    n = r1 + r2
    if n == 0:
        return 1.0
    weight = [math.comb(r1, x) * math.comb(r2, c1 - x) for x in range(max(0, c1 - r2), min(r1, c1) + 1)]
    observed = math.comb(r1, a) * math.comb(r2, c1 - a)
    return min(1.0, sum(w for w in weight if w <= observed) / math.comb(n, c1))


def two_proportion_test(s1: int, n1: int, s2: int, n2: int) -> tuple[float, float]:
    """Two-proportion z-test with the pooled proportion: `(z, two-sided p)`.

    `p = (s1 + s2) / (n1 + n2)`, `z = (s1/n1 - s2/n2) / sqrt(p (1 - p) (1/n1 + 1/n2))`, `p-value = erfc(|z| / sqrt 2)`.
    A pooled proportion of 0 or 1 (no variation) gives z = 0, p = 1.
    """
    if n1 < 1 or n2 < 1 or not (0 <= s1 <= n1 and 0 <= s2 <= n2):
        raise ValueError(f"two_proportion_test: need 0 <= s <= n and n >= 1, got {s1}/{n1} and {s2}/{n2}")
    p = (s1 + s2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    if se == 0:
        return 0.0, 1.0
    z = (s1 / n1 - s2 / n2) / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def compare_proportions(s1: int, n1: int, s2: int, n2: int) -> dict:
    """Success rates of two groups and both tests: `{"rate_1", "rate_2", "difference", "fisher_p", "z", "z_p"}`
    (rates NaN for an empty group; the tests then are not run and give p = 1)."""
    out = {"rate_1": s1 / n1 if n1 else float("nan"), "rate_2": s2 / n2 if n2 else float("nan")}
    out["difference"] = out["rate_1"] - out["rate_2"]
    if n1 and n2:
        z, zp = two_proportion_test(s1, n1, s2, n2)
        out.update(fisher_p=fisher_exact(s1, n1 - s1, s2, n2 - s2), z=z, z_p=zp)
    else:
        out.update(fisher_p=1.0, z=0.0, z_p=1.0)
    return out
