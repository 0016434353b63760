"""The direct nnls gives scipy.optimize.nnls's doubles bit for bit, and falls back to it."""

import numpy as np
import pytest
from scipy.optimize import nnls as scipy_nnls

from prfaas.models import nnls as nnls_module
from prfaas.models.nnls import nnls
from prfaas.models.profile import PrefillTime


def _problems() -> list[tuple[np.ndarray, np.ndarray]]:
    x = np.array([1024, 8192, 32768, 131072.0])  # the case study's H200 prefill points
    design = np.stack([x**2, x, np.ones_like(x)], axis=1)
    out = [(design / design.max(axis=0), np.array([0.44, 0.72, 1.84, 7.40]))]
    rng = np.random.default_rng(3)
    for m, n in ((6, 3), (20, 5), (40, 8)):
        a = rng.normal(size=(m, n))
        out.append((a, a @ rng.normal(size=n) + rng.normal(scale=0.1, size=m)))  # some x < 0
    return out


@pytest.mark.parametrize("k", range(4))
def test_bit_identical_to_scipy_optimize(k: int) -> None:
    a, b = _problems()[k]
    ours, theirs = nnls(a, b), scipy_nnls(a, b)[0]
    assert np.array_equal(ours.view(np.int64), theirs.view(np.int64))
    assert (ours >= 0).all()


def test_inputs_are_not_modified_and_fallback_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _problems()[2]
    a0, b0 = a.copy(), b.copy()
    direct = nnls(a, b)
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    monkeypatch.setattr(nnls_module, "_solver", lambda: None)
    assert np.array_equal(nnls(a, b), direct)


def test_prefill_fit_is_the_published_one() -> None:
    fit = PrefillTime.fit([1024, 8192, 32768, 131072], [0.44, 0.72, 1.84, 7.40])
    assert (round(fit.c2, 14), round(fit.c1, 9), round(fit.c0, 3)) == (9.476e-11, 4.1069e-05,
                                                                        0.389)
