"""The standard normal CDF, vectorised in numpy, without importing scipy.

`ndtr` is Cephes' `ndtr` (the function `scipy.stats.norm.cdf` calls, via scipy.special): the
same branches, polynomial coefficients and operation order. Only exp() differs (numpy picks a
SIMD exp at run time, scipy calls libm's), so the result is within 8 eps relative of scipy's,
not bit-identical on every CPU (tests/workload/test_normal.py derives the bound). Importing
scipy.stats for this one function cost a second of every `prfaas plan` / `simulate` start-up.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

SQRT1_2 = 0.70710678118654752440
MAXLOG = 7.09782712893383996843E2  # log(DBL_MAX): exp(-x^2) underflows past it

# erf(x) = x T(x^2) / U(x^2) for |x| < 1
_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
      7.00332514112805075473E3, 5.55923013010394962768E4)
_U = (3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
      2.26290000613890934246E4, 4.92673942608635921086E4)  # leading 1 implicit
# erfc(x) = exp(-x^2) P(x) / Q(x) for 1 <= x < 8, R / S beyond
_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
      4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
      9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)
_Q = (1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
      9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
      1.65666309194161350182E3, 5.57535340817727675546E2)
_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
      6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)
_S = (2.26052863220117276590E0, 9.39603524938001434673E0, 1.20489539808096656605E1,
      1.70814450747565897222E1, 9.60896809063285878198E0, 3.36907645100081516050E0)

Floats = NDArray[np.float64]


def _polevl(x: Floats, coef: tuple[float, ...]) -> Floats:
    out = np.full_like(x, coef[0])
    for c in coef[1:]:
        out = out * x + c
    return out


def _p1evl(x: Floats, coef: tuple[float, ...]) -> Floats:
    """Like _polevl with a leading coefficient of 1."""
    out = x + coef[0]
    for c in coef[1:]:
        out = out * x + c
    return out


def ndtr(a: ArrayLike) -> Floats:
    """P(N(0, 1) <= a), elementwise (nan stays nan)."""
    with np.errstate(invalid="ignore", over="ignore"):  # +-inf: discarded branches
        return _ndtr(np.asarray(a, dtype=np.float64))


def _ndtr(a: Floats) -> Floats:
    x = a * SQRT1_2
    z = np.abs(x)
    out = np.empty_like(x)
    small = z < 1.0
    zs = z[small]
    erf = zs * _polevl(zs * zs, _T) / _p1evl(zs * zs, _U)  # erf(|x|); erf is odd
    out[small] = 0.5 + 0.5 * np.where(x[small] < 0, -erf, erf)
    big = ~small  # includes nan, which propagates through every branch
    zb = z[big]
    minus_sq = -zb * zb
    under = minus_sq < -MAXLOG
    expo = np.exp(np.where(under, 0.0, minus_sq))
    near = zb < 8.0
    p = np.where(near, _polevl(zb, _P), _polevl(zb, _R))
    q = np.where(near, _p1evl(zb, _Q), _p1evl(zb, _S))
    half_erfc = 0.5 * np.where(under, 0.0, expo * p / q)
    out[big] = np.where(x[big] > 0, 1.0 - half_erfc, half_erfc)
    return out
