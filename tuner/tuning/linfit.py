"""Small weighted least squares in pure Python, with the covariance needed for error bars.

The cost model fits a handful of coefficients (at most a few per term) to per-setting means, so
plain Gauss-Jordan on the normal equations is enough and keeps numpy out of the operator side.
Columns that the probes cannot tell apart (collinear, e.g. the topk column when only chains were
measured) are dropped and remembered, so a prediction that needs them is refused rather than
silently wrong. This module knows nothing about phases or settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


def _invert(a: list[list[float]]) -> list[list[float]]:
    n = len(a)
    m = [row[:] + [1.0 if i == j else 0.0 for j in range(n)] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise ZeroDivisionError("singular matrix")
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        m[col] = [v / p for v in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0.0:
                f = m[r][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col])]
    return [row[n:] for row in m]


@dataclass(frozen=True)
class LinearFit:
    """y ≈ x·coef for the kept columns; `cov` is the coefficient covariance."""

    names: tuple[str, ...]            # every column asked for
    kept: tuple[int, ...]             # indices of identifiable columns
    coef: tuple[float, ...]           # one per kept column
    cov: tuple[tuple[float, ...], ...]
    rms_resid: float                  # unweighted RMS of the point residuals
    n_points: int
    chi2_dof: float                   # weighted residual per degree of freedom (1.0 when no dof)
    dropped_values: tuple[float, ...] = field(default=())  # values of dropped columns seen in the data

    def supports(self, x: Sequence[float]) -> bool:
        """True when x lies where the data pinned the fit down: every dropped column must equal
        the single value it took in the data (then it is absorbed in the kept ones)."""
        dropped = [i for i in range(len(self.names)) if i not in self.kept]
        return all(abs(x[i] - v) < 1e-9 for i, v in zip(dropped, self.dropped_values))

    def predict(self, x: Sequence[float]) -> tuple[float, float]:
        """(mean, standard error of the mean) at feature vector x (all columns)."""
        xs = [x[i] for i in self.kept]
        mean = sum(c * v for c, v in zip(self.coef, xs))
        var = sum(xs[i] * self.cov[i][j] * xs[j] for i in range(len(xs)) for j in range(len(xs)))
        return mean, math.sqrt(max(var, 0.0))

    def coefficient(self, name: str) -> tuple[float, float] | None:
        """(value, standard error) of a named column, None when it was not identifiable."""
        i = self.names.index(name)
        if i not in self.kept:
            return None
        j = self.kept.index(i)
        return self.coef[j], math.sqrt(max(self.cov[j][j], 0.0))

    def to_json(self) -> dict:
        coefs = {}
        for name in self.names:
            c = self.coefficient(name)
            coefs[name] = None if c is None else {"value": c[0], "se": c[1]}
        return {"coef": coefs, "rms_resid": self.rms_resid, "n_points": self.n_points,
                "chi2_dof": self.chi2_dof}


def _independent_columns(rows: Sequence[Sequence[float]], ncol: int) -> list[int]:
    """Greedy Gram-Schmidt over columns, in order: keep a column if it adds a new direction."""
    basis: list[list[float]] = []
    kept: list[int] = []
    for c in range(ncol):
        v = [r[c] for r in rows]
        norm0 = math.sqrt(sum(t * t for t in v))
        if norm0 == 0.0:
            continue
        for b in basis:
            d = sum(p * q for p, q in zip(v, b))
            v = [p - d * q for p, q in zip(v, b)]
        norm = math.sqrt(sum(t * t for t in v))
        if norm > 1e-7 * norm0:
            basis.append([t / norm for t in v])
            kept.append(c)
    return kept


def fit_linear(names: Sequence[str], x: Sequence[Sequence[float]], y: Sequence[float],
               se: Sequence[float] | None = None) -> LinearFit:
    """Weighted least squares of y on the columns of x (weights 1/se²).

    The covariance is (XᵀWX)⁻¹, inflated by the reduced χ² when the model fits the points worse
    than their own standard errors say (lack of fit widens the error bars instead of hiding).
    """
    if not x or len(x) != len(y):
        raise ValueError("fit_linear needs at least one point and as many y as rows")
    ncol = len(names)
    kept = _independent_columns(x, ncol)
    if not kept:
        raise ValueError("fit_linear: every column is zero")
    dropped = [i for i in range(ncol) if i not in kept]
    # A dropped column is only safe to ignore where it keeps the one value it had in the data.
    dropped_values = tuple(x[0][i] for i in dropped)
    floor = 1e-9
    w = [1.0 / max(s, floor) ** 2 for s in se] if se is not None else [1.0] * len(y)
    xs = [[row[i] for i in kept] for row in x]
    k = len(kept)
    xtwx = [[sum(w[r] * xs[r][i] * xs[r][j] for r in range(len(xs))) for j in range(k)]
            for i in range(k)]
    xtwy = [sum(w[r] * xs[r][i] * y[r] for r in range(len(xs))) for i in range(k)]
    inv = _invert(xtwx)
    coef = [sum(inv[i][j] * xtwy[j] for j in range(k)) for i in range(k)]
    resid = [y[r] - sum(c * v for c, v in zip(coef, xs[r])) for r in range(len(xs))]
    dof = len(y) - k
    chi2 = sum(w[r] * resid[r] ** 2 for r in range(len(y)))
    if se is None:
        # Unweighted: the residual variance is the only noise estimate there is.
        scale = chi2 / dof if dof > 0 else 0.0
        chi2_dof = 1.0
    else:
        chi2_dof = chi2 / dof if dof > 0 else 1.0
        scale = max(1.0, chi2_dof)
    cov = tuple(tuple(v * scale for v in row) for row in inv)
    rms = math.sqrt(sum(r * r for r in resid) / len(resid))
    return LinearFit(tuple(names), tuple(kept), tuple(coef), cov, rms, len(y), chi2_dof,
                     dropped_values)
