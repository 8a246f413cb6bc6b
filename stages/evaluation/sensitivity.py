"""Which randomized factors are associated with failure: a sensitivity analysis of one scene.

From a scene's per-episode records (:mod:`stages.evaluation.episodes`), every factor that varied
across the episodes enters one logistic model of failure,

    P(fail | z) = sigmoid(b0 + sum_k b_k z_k),   z_k = (x_k - mean x_k) / sd x_k,

so ``b_k`` is the change in the log-odds of failure per standard deviation of factor k, the
others held fixed; a positive effect means more of the factor, more failures. Factors are
ranked by ``|b_k|``.

The model is Bayesian: independent normal priors, N(0, 2.5^2) on every standardized effect
(the weakly informative scale of Gelman et al., 2008, "A weakly informative default prior
distribution for logistic and other regression models") and N(0, 10^2) on the intercept, fit
by Newton's method to the posterior mode, with the 95% interval of each effect from the
Laplace approximation (the inverse Hessian of the negative log posterior at the mode). Why
not the maximum-likelihood fit (``statsmodels.Logit``): the case this analysis exists for, a
policy that fails exactly beyond a threshold of one factor, separates the outcomes
completely, and there the maximum-likelihood estimate does not exist (the coefficients
diverge and statsmodels stops with a separation error); penalized fits of scikit-learn or
``fit_regularized`` give no intervals. With the prior the mode is finite and the interval
meaningful, and a factor with no effect keeps an interval around zero. The fit is a few
Newton steps on a (factors + 1)-square system, written here with numpy for that reason.

A factor of text (an episode's ``instruction``) is categorical: each of its levels but one
enters the model as an indicator named ``<factor>=<level>`` (1 for the episodes given that
level), against the reference level whose episodes failed least (ties: the one of most
episodes, then the first in sorted order). Its effect is the change in log-odds of failure per
standard deviation of the indicator against that level, so a level that fails more than the
best one has a positive effect, and its means are the fraction of failed and of successful
episodes that had the level. The reference is chosen from the outcomes, which makes the
intervals of levels that fail about as often as the best one a little narrow; a level that
fails far more than the rest is what this is for. A text factor with one level did not vary
and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stages.artifacts.records import FactorEffect

PRIOR_SD = 2.5
"""Prior standard deviation of a standardized effect (log-odds per SD of the factor)."""
INTERCEPT_SD = 10.0
"""Prior standard deviation of the intercept (log-odds)."""
Z95 = 1.959963984540054
METHOD = ("Bayesian logistic regression of failure on the standardized factors, N(0, 2.5^2) "
          "priors, posterior mode with Laplace 95% intervals")
"""How :func:`factor_effects` estimates, recorded with every ranking."""

OUTCOME_COLUMNS = frozenset({"episode", "success", "return", "failure", "miss"})
"""Columns of an episode table that are outcomes, not conditions."""


def factor_effects(columns: Mapping[str, np.ndarray], units: Mapping[str, str]
                   ) -> tuple[FactorEffect, ...]:
    """Rank the factors of one scene's episode table by their association with failure
    (module doc); factors that did not vary are left out, and so is every factor when no
    episode failed or none succeeded (there is nothing to explain)."""
    success = np.asarray(columns["success"], bool)
    failed = ~success
    factors = _factor_columns(columns, failed)
    names = list(factors)
    units = {**units, **{k: "" for k in names if k not in columns}}
    x = np.column_stack([factors[k] for k in names]) if names \
        else np.zeros((len(success), 0))
    finite: np.ndarray = np.asarray(np.isfinite(x).all(axis=0))
    sd: np.ndarray = x.std(axis=0) if x.size else np.zeros(0)
    keep = [i for i in range(len(names))
            if finite[i] and sd[i] > 1e-12 * (1 + np.abs(x[:, i]).max())]
    if not keep or failed.all() or success.all():
        return ()
    z = (x[:, keep] - x[:, keep].mean(axis=0)) / sd[keep]
    mode, cov = _posterior_mode(z, failed.astype(np.float64))
    half = Z95 * np.sqrt(np.diag(cov)[1:])
    effects = []
    for j, i in enumerate(keep):
        column = x[:, i]
        effects.append(FactorEffect(
            name=names[i], unit=units.get(names[i], ""), effect=float(mode[1 + j]),
            ci_low=float(mode[1 + j] - half[j]), ci_high=float(mode[1 + j] + half[j]),
            sd=float(sd[i]),
            mean_failed=float(column[failed].mean()),
            mean_succeeded=float(column[success].mean())))
    return tuple(sorted(effects, key=lambda e: -abs(e.effect)))


def _factor_columns(columns: Mapping[str, np.ndarray], failed: np.ndarray
                    ) -> dict[str, np.ndarray]:
    """Every factor of an episode table as numbers: a numeric column as it is; a text column
    as one indicator per level but its reference level (the module doc), ``<name>=<level>``.
    ``failed``: (episodes,) bool."""
    out: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        if name in OUTCOME_COLUMNS:
            continue
        array = np.asarray(values)
        if np.issubdtype(array.dtype, np.number):
            out[name] = array.astype(np.float64)
        elif array.dtype.kind in "USO":
            text = array.astype(str)
            levels = np.unique(text)
            reference = min(levels, key=lambda level: (
                failed[text == level].mean(), -(text == level).sum(), level))
            for level in levels:
                if level != reference:
                    out[f"{name}={level}"] = (text == level).astype(np.float64)
    return out


def _posterior_mode(z: np.ndarray, y: np.ndarray, iterations: int = 100
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mode of the logistic model with the module's priors, and the Laplace
    covariance there. ``z``: (n, k) standardized factors; ``y``: (n,) 1 for failure."""
    design = np.column_stack([np.ones(len(z)), z])
    precision = np.full(design.shape[1], 1.0 / PRIOR_SD**2)
    precision[0] = 1.0 / INTERCEPT_SD**2
    beta = np.zeros(design.shape[1])
    hessian = np.diag(precision)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(design @ beta)))
        gradient = design.T @ (y - p) - precision * beta
        hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(precision)
        step = np.linalg.solve(hessian, gradient)
        beta = beta + step
        if np.abs(step).max() < 1e-10:
            break
    p = 1.0 / (1.0 + np.exp(-(design @ beta)))
    hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(precision)
    return beta, np.linalg.inv(hessian)
