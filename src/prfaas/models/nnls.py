"""Nonnegative least squares: scipy's solver without the cost of importing scipy.optimize.

`import scipy.optimize` takes ~0.6 s (it pulls scipy.linalg, sparse, fft...), which used to be
most of a `prfaas plan` run: every scenario with measured prefill points fits its profile with
`scipy.optimize.nnls`. That function is a thin wrapper over the compiled Lawson-Hanson solver
`scipy.optimize._slsqplib.nnls`; `nnls` here loads that one extension module directly (~2 ms)
and calls it the same way (tests/models/test_nnls.py checks the optimality conditions and the
agreement with the public function within least-squares perturbation bounds). If a scipy
release moves the module, `nnls` falls back to `scipy.optimize.nnls`: slower, never different.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from numpy.typing import ArrayLike, NDArray

_MODULE = "scipy.optimize._slsqplib"


def _solver() -> ModuleType | None:
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    try:
        import scipy

        folder = Path(scipy.__file__).parent / "optimize"
        path = next(iter(sorted(folder.glob("_slsqplib.*"))), None)
        if path is None:
            return None
        spec = importlib.util.spec_from_file_location(_MODULE, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    if not hasattr(module, "nnls"):
        return None
    sys.modules[_MODULE] = module  # one instance, shared with a later scipy.optimize import
    return module


def nnls(a: ArrayLike, b: ArrayLike) -> NDArray[np.float64]:
    """x >= 0 minimising ||a x - b||_2 (a: m x n, b: m), as `scipy.optimize.nnls(a, b)[0]`."""
    # copies: the compiled solver works in place
    a_arr = np.array(np.asarray_chkfinite(a, dtype=np.float64), order="C")
    b_arr = np.array(np.asarray_chkfinite(b, dtype=np.float64))
    module = _solver()
    if module is None:
        from scipy.optimize import nnls as public

        return np.asarray(public(a_arr, b_arr)[0], dtype=np.float64)
    x, _, info = module.nnls(a_arr, b_arr, 3 * a_arr.shape[1])
    if info == 3:
        raise RuntimeError("nnls: maximum number of iterations reached")
    return np.asarray(x, dtype=np.float64)
