"""The direct nnls solves NNLS (KKT within a derived tolerance) and agrees with
scipy.optimize.nnls within least-squares perturbation bounds, not bit for bit.

Both are Lawson-Hanson with Householder least squares, backward stable: each computed x is the
exact solution for (A + dA, b + db) with |dA| <= g |A|, |db| <= g |b|, g = c m n u (Higham,
Accuracy and Stability, Thm 20.3; u = 2^-53, c = 10 taken as the usual small constant). Hence
- KKT: the gradient A^T (A x - b) is 0 on the passive set and >= 0 on the active set, each
  entry within g * (|A|^T (|r| + |A| |x| + |b|)) (first order in dA, db, plus its own rounding);
- two such solvers with the same active set P differ by ||dx|| / ||x|| <= 2 k g (2 + (k + 1)
  ||r|| / (||A_P|| ||x||)), k = cond(A_P) (Higham Thm 20.1, both sides perturbed).
"""

import numpy as np
import pytest
from scipy.optimize import nnls as scipy_nnls

from prfaas.models import nnls as nnls_module
from prfaas.models.nnls import nnls
from prfaas.models.profile import PrefillTime

U = 2.0**-53


def _problems() -> list[tuple[np.ndarray, np.ndarray]]:
    x = np.array([1024, 8192, 32768, 131072.0])  # the case study's H200 prefill points
    design = np.stack([x**2, x, np.ones_like(x)], axis=1)
    out = [(design / design.max(axis=0), np.array([0.44, 0.72, 1.84, 7.40]))]
    rng = np.random.default_rng(3)
    for m, n in ((6, 3), (20, 5), (40, 8)):
        a = rng.normal(size=(m, n))
        out.append((a, a @ rng.normal(size=n) + rng.normal(scale=0.1, size=m)))  # some x < 0
    return out


def _kkt_excess(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
    """max violation / tolerance of the NNLS optimality conditions (<= 1 passes)."""
    if (x < 0).any():
        return np.inf
    m, n = a.shape
    r = a @ x - b
    grad = a.T @ r
    tol = 10 * m * n * U * (np.abs(a).T @ (np.abs(r) + np.abs(a) @ np.abs(x) + np.abs(b)))
    passive = x > 0
    worst = np.abs(grad[passive]) / tol[passive]
    worst = np.append(worst, -grad[~passive] / tol[~passive])  # must be >= 0 there
    return float(worst.max())


def _ls_bound(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
    m, n = a.shape
    a_p = a[:, x > 0]
    k = float(np.linalg.cond(a_p))
    rel = float(np.linalg.norm(a @ x - b) / (np.linalg.norm(a_p, 2) * np.linalg.norm(x)))
    return 2 * k * 10 * m * n * U * (2 + (k + 1) * rel)


@pytest.mark.parametrize("k", range(4))
def test_solves_nnls_and_agrees_with_scipy_within_the_bound(k: int) -> None:
    a, b = _problems()[k]
    ours, theirs = nnls(a, b), scipy_nnls(a, b)[0]
    assert (ours >= 0).all() and _kkt_excess(a, b, ours) <= 1.0
    assert np.array_equal(ours > 0, theirs > 0)
    bound = _ls_bound(a, b, theirs)
    assert np.linalg.norm(ours - theirs) <= bound * np.linalg.norm(theirs)
    # negative controls: a 1e-9 relative error, or a dropped passive variable, fails both checks
    wrong = ours * (1 + 1e-9 * np.arange(1, ours.size + 1))
    assert np.linalg.norm(wrong - theirs) > bound * np.linalg.norm(theirs)
    assert _kkt_excess(a, b, wrong) > 1.0
    dropped = ours.copy()
    dropped[np.argmax(ours)] = 0.0
    assert _kkt_excess(a, b, dropped) > 1.0


def test_inputs_are_not_modified_and_fallback_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _problems()[2]
    a0, b0 = a.copy(), b.copy()
    direct = nnls(a, b)
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    monkeypatch.setattr(nnls_module, "_solver", lambda: None)
    fallback = nnls(a, b)
    assert np.linalg.norm(fallback - direct) <= _ls_bound(a, b, direct) * np.linalg.norm(direct)
    assert np.array_equal(nnls(a, b).view(np.int64), fallback.view(np.int64))  # determinism


def test_prefill_fit_is_the_published_one() -> None:
    fit = PrefillTime.fit([1024, 8192, 32768, 131072], [0.44, 0.72, 1.84, 7.40])
    assert (round(fit.c2, 14), round(fit.c1, 9), round(fit.c0, 3)) == (9.476e-11, 4.1069e-05,
                                                                        0.389)
