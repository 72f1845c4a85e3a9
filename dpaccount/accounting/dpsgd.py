"""DP-SGD accounting: epsilon of a training run, noise calibration, per-step charges.

DP-SGD (Abadi et al. 2016) runs ``steps`` Poisson-subsampled Gaussian mechanisms with
sampling rate q and noise multiplier sigma (noise standard deviation / clipping norm),
under add/remove neighbours. Its epsilon is computed on the privacy loss distribution
(`dpaccount.accounting.pld`, the default and tightest) or by Renyi DP
(`dpaccount.accounting.rdp`).

Examples:
    >>> eps = dpsgd_epsilon(0.01, 1.0, 100, 1e-5, value_discretization_interval=1e-3)
    >>> 0.7 < float(eps) < 0.75
    True
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dpaccount._numeric import (
    check_count,
    check_delta,
    check_epsilon,
    check_float_delta,
    check_positive,
    check_rate,
)
from dpaccount.accounting.pld import DEFAULT_INTERVAL, PrivacyLossDistribution
from dpaccount.accounting.rdp import DEFAULT_ORDERS, _refined_epsilon, subsampled_gaussian_rdp
from dpaccount.charges import GaussianCharge, Scheme, Subsampled
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["calibrate_dpsgd_noise", "dpsgd_epsilon", "dpsgd_epsilon_bounds", "dpsgd_step_charge"]


def dpsgd_step_charge(
    sampling_rate: Any, noise_multiplier: Any, *, epsilon: Any = 1
) -> Subsampled:
    """The charge of one DP-SGD step, for ``accountant.charge(...)`` in a training loop.

    A Poisson-subsampled Gaussian with sensitivity 1 (the clipping norm) and standard
    deviation ``noise_multiplier``. ``epsilon`` only selects the point at which its
    stand-alone (epsilon, delta) is shown; tight rules use sigma and the rate.

    Examples:
        >>> c = dpsgd_step_charge(0.01, 1.1)
        >>> float(c.rate), float(c.charge.sigma), c.scheme.value
        (0.01, 1.1, 'poisson')
    """
    return Subsampled(
        GaussianCharge(sigma=noise_multiplier, sensitivity=1, epsilon=epsilon),
        rate=sampling_rate,
        scheme=Scheme.POISSON,
    )


def dpsgd_epsilon_bounds(
    sampling_rate: Any,
    noise_multiplier: Any,
    steps: int,
    target_delta: Any,
    *,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    lower: bool = True,
) -> tuple[Fraction, Fraction | None]:
    """(lower, upper) epsilon of DP-SGD from the privacy loss distribution.

    ``upper`` is certified (None if unbounded); ``lower`` bounds what the PLD of the
    dominating pairs gives from below (0 if ``lower=False``, which halves the work).
    """
    q = check_rate(sampling_rate, "sampling_rate")
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    k = check_count(steps, "steps")
    delta = check_delta(target_delta, "target_delta")
    pld = PrivacyLossDistribution.gaussian(
        sigma,
        1,
        sampling_rate=q,
        value_discretization_interval=value_discretization_interval,
        lower=lower,
    )
    return pld.self_compose(k).epsilon(delta)


def dpsgd_epsilon(
    sampling_rate: Any,
    noise_multiplier: Any,
    steps: int,
    target_delta: Any,
    *,
    accountant: str = "pld",
    value_discretization_interval: Any = DEFAULT_INTERVAL,
) -> Fraction:
    """A certified upper bound on the epsilon of DP-SGD at ``target_delta``.

    Args:
        sampling_rate: Poisson sampling rate q in (0, 1] (batch size / dataset size).
        noise_multiplier: sigma / clipping norm, > 0.
        steps: Number of steps (integer >= 1).
        target_delta: delta in (0, 1).
        accountant: ``"pld"`` (privacy loss distribution; tightest) or ``"rdp"``
            (Renyi DP, Mironov, Talwar and Zhang 2019, with the improved conversion).
        value_discretization_interval: PLD accuracy (ignored by ``"rdp"``).

    Returns:
        The epsilon as an exact Fraction, rounded up. Infinite results raise.

    Raises:
        InvalidCostError: Invalid numbers, or no finite epsilon at ``target_delta``.
        ConfigError: An unknown ``accountant``.

    Examples:
        >>> e_rdp = dpsgd_epsilon(0.01, 1.0, 100, 1e-5, accountant="rdp")
        >>> e_pld = dpsgd_epsilon(0.01, 1.0, 100, 1e-5, value_discretization_interval=1e-3)
        >>> e_pld < e_rdp
        True
    """
    if accountant == "pld":
        _low, high = dpsgd_epsilon_bounds(
            sampling_rate,
            noise_multiplier,
            steps,
            target_delta,
            value_discretization_interval=value_discretization_interval,
            lower=False,
        )
        if high is None:
            raise InvalidCostError("target_delta", target_delta, "no finite epsilon reaches it")
        return high
    if accountant == "rdp":
        q = check_rate(sampling_rate, "sampling_rate")
        sigma = check_positive(noise_multiplier, "noise_multiplier")
        k = check_count(steps, "steps")
        delta = float(check_float_delta(check_delta(target_delta, "target_delta")))
        if delta <= 0:
            raise InvalidCostError("target_delta", target_delta, "must be > 0 for RDP")
        eps = _refined_epsilon(
            lambda a: k * subsampled_gaussian_rdp(q, sigma, a), DEFAULT_ORDERS, delta
        )
        eps = math.nextafter(eps * (1 + 1e-12), math.inf)
        return Fraction(eps)
    raise ConfigError(f"unknown accountant {accountant!r}; choose 'pld' or 'rdp'")


def calibrate_dpsgd_noise(
    sampling_rate: Any,
    steps: int,
    target_epsilon: Any,
    target_delta: Any,
    *,
    accountant: str = "pld",
    tolerance: float = 1e-3,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
) -> Fraction:
    """The smallest noise multiplier (to ``tolerance``) whose certified epsilon fits.

    Bisection on sigma (epsilon is non-increasing in sigma); the returned sigma is the
    upper end of the final bracket, and its certified epsilon is computed again and
    checked to be <= ``target_epsilon`` before it is returned.

    Raises:
        InvalidCostError: For invalid numbers, or if no sigma up to 1e4 reaches the
            target.

    Examples:
        >>> sigma = calibrate_dpsgd_noise(0.01, 100, 1.0, 1e-5, tolerance=1e-2,
        ...                               value_discretization_interval=1e-3)
        >>> 0.85 < float(sigma) < 0.95
        True
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    if target == 0:
        raise InvalidCostError("target_epsilon", target_epsilon, "must be > 0")
    tol = float(check_positive(tolerance, "tolerance"))

    def fits(sigma: float) -> bool:
        try:
            eps = dpsgd_epsilon(
                sampling_rate, sigma, steps, target_delta, accountant=accountant,
                value_discretization_interval=value_discretization_interval,
            )
        except InvalidCostError:
            return False
        return eps <= target

    lo, hi = 0.0, 1.0
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise InvalidCostError(
                "target_epsilon", target_epsilon, "no noise multiplier up to 1e4 reaches it"
            )
    if lo == 0.0:
        lo = hi / 2
        while fits(lo) and lo > tol:
            hi, lo = lo, lo / 2
    while hi - lo > tol * max(hi, 1e-9):
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    if not fits(hi):  # pragma: no cover - defensive re-check
        raise InvalidCostError("target_epsilon", target_epsilon, "calibration failed")
    return Fraction(hi)
