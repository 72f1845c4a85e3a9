"""DP-SGD accounting: epsilon of a training run, noise calibration, per-step charges.

DP-SGD (Abadi et al. 2016) runs ``steps`` Poisson-subsampled Gaussian mechanisms with
sampling rate q and noise multiplier sigma (noise standard deviation / clipping norm),
under add/remove neighbours. Its epsilon is computed on the privacy loss distribution
(`dpaccount.accounting.pld`, the default and tightest) or by Renyi DP
(`dpaccount.accounting.rdp`).

Every helper takes the same keyword-only names, and a run is given either way:

* ``sampling_rate`` and ``steps``; or
* ``dataset_size``, ``batch_size`` and ``epochs``, as TensorFlow Privacy's
  ``compute_dp_sgd_privacy`` takes them: q = batch_size / dataset_size and
  steps = ceil(epochs * dataset_size / batch_size) (`dpsgd_schedule`). A rate with
  ``epochs`` works too.

Results are floats, rounded toward more privacy loss: an epsilon up, a noise multiplier
up.

Examples:
    >>> eps = dpsgd_epsilon(sampling_rate=0.01, noise_multiplier=1.0, steps=100,
    ...                     target_delta=1e-5, value_discretization_interval=1e-3)
    >>> 0.7 < eps < 0.75
    True
    >>> dpsgd_schedule(dataset_size=60000, batch_size=256, epochs=60)
    (Fraction(8, 1875), 14063)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from dpaccount._numeric import (
    check_count,
    check_delta,
    check_epsilon,
    check_float_delta,
    check_positive,
    check_rate,
    float_down,
    float_up,
)
from dpaccount.accounting.pld import DEFAULT_INTERVAL, PrivacyLossDistribution
from dpaccount.accounting.rdp import sgm_epsilon
from dpaccount.charges import GaussianCharge, Scheme, Subsampled
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = [
    "calibrate_dpsgd_noise",
    "dpsgd_epsilon",
    "dpsgd_epsilon_bounds",
    "dpsgd_schedule",
    "dpsgd_step_charge",
]

_ACCOUNTANTS = ("pld", "rdp")
#: The largest noise multiplier calibration tries before it gives up.
MAX_NOISE_MULTIPLIER = 1e4


def _rate(sampling_rate: Any, dataset_size: Any, batch_size: Any) -> Fraction:
    if sampling_rate is not None:
        if dataset_size is not None or batch_size is not None:
            raise ConfigError(
                "give the sampling rate either as sampling_rate or as batch_size and "
                "dataset_size, not both"
            )
        return check_rate(sampling_rate, "sampling_rate")
    if dataset_size is None or batch_size is None:
        raise ConfigError(
            "the sampling rate is missing: give sampling_rate, or batch_size and "
            "dataset_size (q = batch_size / dataset_size)"
        )
    n = check_count(dataset_size, "dataset_size")
    b = check_count(batch_size, "batch_size")
    if b > n:
        raise ConfigError(f"batch_size ({b}) is larger than dataset_size ({n})")
    return Fraction(b, n)


def dpsgd_schedule(
    *,
    sampling_rate: Any = None,
    steps: Any = None,
    dataset_size: Any = None,
    batch_size: Any = None,
    epochs: Any = None,
) -> tuple[Fraction, int]:
    """The (sampling rate, number of steps) of a run, from either way of giving it.

    The rate is ``sampling_rate``, or ``batch_size / dataset_size`` (the expected batch
    of Poisson sampling). The steps are ``steps``, or ceil(epochs / rate) (TensorFlow
    Privacy's ``compute_dp_sgd_privacy`` convention: ceil(epochs * n / batch_size)).

    Raises:
        ConfigError: Both or neither of a pair was given, or batch_size > dataset_size.
        InvalidCostError: A number is invalid (not a count, a rate outside (0, 1]).

    Examples:
        >>> dpsgd_schedule(sampling_rate="0.01", epochs=2)
        (Fraction(1, 100), 200)
    """
    q = _rate(sampling_rate, dataset_size, batch_size)
    if steps is not None:
        if epochs is not None:
            raise ConfigError("give the length of the run as steps or as epochs, not both")
        return q, check_count(steps, "steps")
    if epochs is None:
        raise ConfigError("the length of the run is missing: give steps or epochs")
    e = check_positive(epochs, "epochs")
    return q, max(1, math.ceil(e / q))


def dpsgd_step_charge(
    *,
    noise_multiplier: Any,
    sampling_rate: Any = None,
    dataset_size: Any = None,
    batch_size: Any = None,
    epsilon: Any = 1,
) -> Subsampled:
    """The charge of one DP-SGD step, for ``accountant.charge(...)`` in a training loop.

    A Poisson-subsampled Gaussian with sensitivity 1 (the clipping norm) and standard
    deviation ``noise_multiplier``. ``epsilon`` only selects the point at which its
    stand-alone (epsilon, delta) is shown; tight rules use sigma and the rate.

    Examples:
        >>> c = dpsgd_step_charge(sampling_rate=0.01, noise_multiplier=1.1)
        >>> float(c.rate), float(c.charge.sigma), c.scheme.value
        (0.01, 1.1, 'poisson')
    """
    return Subsampled(
        GaussianCharge(sigma=noise_multiplier, sensitivity=1, epsilon=epsilon),
        rate=_rate(sampling_rate, dataset_size, batch_size),
        scheme=Scheme.POISSON,
    )


def dpsgd_epsilon_bounds(
    *,
    noise_multiplier: Any,
    target_delta: Any,
    sampling_rate: Any = None,
    steps: Any = None,
    dataset_size: Any = None,
    batch_size: Any = None,
    epochs: Any = None,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    lower: bool = True,
) -> tuple[float, float | None]:
    """(lower, upper) epsilon of DP-SGD from the privacy loss distribution.

    ``upper`` is certified and rounded up (None if unbounded); ``lower`` bounds what the
    PLD of the dominating pairs gives from below, rounded down (0 if ``lower=False``,
    which halves the work).
    """
    q, k = dpsgd_schedule(sampling_rate=sampling_rate, steps=steps,
                          dataset_size=dataset_size, batch_size=batch_size, epochs=epochs)
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    delta = check_delta(target_delta, "target_delta")
    pld = PrivacyLossDistribution.gaussian(
        sigma,
        1,
        sampling_rate=q,
        value_discretization_interval=value_discretization_interval,
        lower=lower,
    )
    low, high = pld.self_compose(k).epsilon(delta)
    return float_down(low), None if high is None else float_up(high)


def _epsilon(q: Fraction, sigma: Any, k: int, delta: Fraction, accountant: str,
             interval: Any, refine: bool = True) -> float:
    """Certified epsilon of k steps; inf where no finite epsilon reaches delta."""
    if accountant == "pld":
        pld = PrivacyLossDistribution.gaussian(
            check_positive(sigma, "noise_multiplier"), 1, sampling_rate=q,
            value_discretization_interval=interval, lower=False,
        )
        _low, high = pld.self_compose(k).epsilon(delta)
        return math.inf if high is None else float_up(high)
    return sgm_epsilon(q, sigma, k, delta, refine=refine)


def _check_accountant(accountant: str, delta: Fraction) -> None:
    if accountant not in _ACCOUNTANTS:
        raise ConfigError(f"unknown accountant {accountant!r}; choose 'pld' or 'rdp'")
    if accountant == "rdp":
        check_float_delta(delta)
        if delta == 0:
            raise InvalidCostError("target_delta", delta, "must be > 0 for RDP")


def dpsgd_epsilon(
    *,
    noise_multiplier: Any,
    target_delta: Any,
    sampling_rate: Any = None,
    steps: Any = None,
    dataset_size: Any = None,
    batch_size: Any = None,
    epochs: Any = None,
    accountant: str = "pld",
    value_discretization_interval: Any = DEFAULT_INTERVAL,
) -> float:
    """A certified upper bound on the epsilon of DP-SGD at ``target_delta``.

    Args:
        noise_multiplier: sigma / clipping norm, > 0.
        target_delta: delta in (0, 1).
        sampling_rate: Poisson sampling rate q in (0, 1]; or give ``dataset_size`` and
            ``batch_size``.
        steps: Number of steps (integer >= 1); or give ``epochs``.
        dataset_size: The number of training examples n.
        batch_size: The expected batch size (q = batch_size / n).
        epochs: Passes over the data (steps = ceil(epochs / q)).
        accountant: ``"pld"`` (privacy loss distribution; tightest) or ``"rdp"``
            (Renyi DP, Mironov, Talwar and Zhang 2019, with the improved conversion).
        value_discretization_interval: PLD accuracy (ignored by ``"rdp"``).

    Returns:
        The epsilon as a float, rounded up.

    Raises:
        InvalidCostError: Invalid numbers, or no finite epsilon at ``target_delta``.
        ConfigError: An unknown ``accountant``, or an incomplete or doubled schedule.

    Examples:
        >>> run = dict(noise_multiplier=1.0, steps=100, target_delta=1e-5)
        >>> e_rdp = dpsgd_epsilon(sampling_rate=0.01, accountant="rdp", **run)
        >>> e_pld = dpsgd_epsilon(sampling_rate=0.01, value_discretization_interval=1e-3,
        ...                       **run)
        >>> e_pld < e_rdp
        True
    """
    q, k = dpsgd_schedule(sampling_rate=sampling_rate, steps=steps,
                          dataset_size=dataset_size, batch_size=batch_size, epochs=epochs)
    delta = check_delta(target_delta, "target_delta")
    _check_accountant(accountant, delta)
    check_positive(noise_multiplier, "noise_multiplier")
    eps = _epsilon(q, noise_multiplier, k, delta, accountant, value_discretization_interval)
    if math.isinf(eps):
        raise InvalidCostError("target_delta", target_delta, "no finite epsilon reaches it")
    return eps


def _smallest_fitting(fits: Callable[[float], bool], tolerance: float, start: float,
                      what: Any) -> float:
    """Bisection for the smallest sigma with ``fits(sigma)`` (fits is monotone)."""
    lo, hi = 0.0, start
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_NOISE_MULTIPLIER:
            raise InvalidCostError(
                "target_epsilon", what,
                f"no noise multiplier up to {MAX_NOISE_MULTIPLIER:g} reaches it",
            )
    if lo == 0.0:
        lo = hi / 2
        while fits(lo) and lo > tolerance:
            hi, lo = lo, lo / 2
    while hi - lo > tolerance * max(hi, 1e-9):
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _interpolated_search(eps_of: Callable[[float], float], cap: float, start: float,
                         tolerance: float, what: Any) -> float:
    """The smallest sigma (to ``tolerance``) with ``eps_of(sigma) <= cap``, in few calls.

    For an expensive, smooth, non-increasing epsilon (the PLD): bracket from ``start``,
    estimate the crossing by a secant through the two points nearest to it (ln epsilon
    against ln sigma), and test a bracket of the tolerance's width around the estimate,
    so that a good estimate ends the search in two calls.
    """
    seen: list[tuple[float, float]] = []

    def evaluate(sigma: float) -> float:
        value = eps_of(sigma)
        seen.append((sigma, value))
        return value

    hi = start
    while evaluate(hi) > cap:
        hi *= 2
        if hi > MAX_NOISE_MULTIPLIER:
            raise InvalidCostError(
                "target_epsilon", what,
                f"no noise multiplier up to {MAX_NOISE_MULTIPLIER:g} reaches it",
            )
    lo = hi * 0.95  # the PLD's sigma is a few percent below the RDP's
    while evaluate(lo) <= cap:
        hi = lo
        if lo <= tolerance:
            return hi
        lo *= 0.8
    while hi - lo > tolerance * hi:
        guess = _secant_guess(seen, cap, lo, hi)
        half = tolerance * hi / 2
        above = min(guess + half, hi - (hi - lo) * 0.01)
        if evaluate(above) > cap:
            lo = above
            continue
        hi = above
        below = max(above - 2 * half, lo)
        if below > lo:
            if evaluate(below) > cap:
                lo = below
            else:
                hi = below
    return hi


def _secant_guess(seen: list[tuple[float, float]], cap: float, lo: float, hi: float
                  ) -> float:
    """Where ln(epsilon) crosses ln(cap), by the two finite points nearest to it."""
    finite = [(s, e) for s, e in seen if 0 < e < math.inf]
    finite.sort(key=lambda point: abs(math.log(point[1] / cap)))
    width = hi - lo
    if len(finite) >= 2 and finite[0][0] != finite[1][0]:
        (s1, e1), (s2, e2) = finite[:2]
        slope = (math.log(e2) - math.log(e1)) / (math.log(s2) - math.log(s1))
        if slope < 0:
            guess = s1 * math.exp((math.log(cap) - math.log(e1)) / slope)
            return min(max(guess, lo + 0.01 * width), hi - 0.01 * width)
    return (lo + hi) / 2


def calibrate_dpsgd_noise(
    *,
    target_epsilon: Any,
    target_delta: Any,
    sampling_rate: Any = None,
    steps: Any = None,
    dataset_size: Any = None,
    batch_size: Any = None,
    epochs: Any = None,
    accountant: str = "pld",
    tolerance: float = 1e-3,
    value_discretization_interval: Any = DEFAULT_INTERVAL,
    progress: Callable[[int, int | None], object] | None = None,
) -> float:
    """The smallest noise multiplier (to ``tolerance``) whose certified epsilon fits.

    Bisection on sigma (epsilon is non-increasing in sigma); the returned sigma is the
    upper end of the final bracket, and its certified epsilon is computed again and
    checked to be <= ``target_epsilon`` before it is returned. The schedule is given as
    in `dpsgd_epsilon`. The PLD search starts from the (fast) Renyi-DP answer, which is
    never smaller.

    A PLD calibration of a long run evaluates a privacy loss distribution of many
    thousands of compositions at each step of the search (seconds each); give
    ``progress`` to hear of each evaluation: it is called as ``progress(n, None)``
    after the n-th epsilon is computed (the number of steps of a search is not known in
    advance). It changes nothing in the search or its answer.

    Raises:
        InvalidCostError: For invalid numbers, or if no sigma up to 1e4 reaches the
            target.
        ConfigError: An unknown ``accountant``, or an incomplete or doubled schedule.

    Examples:
        >>> sigma = calibrate_dpsgd_noise(sampling_rate=0.01, steps=100, target_epsilon=1.0,
        ...                               target_delta=1e-5, tolerance=1e-2,
        ...                               value_discretization_interval=1e-3)
        >>> 0.85 < sigma < 0.95
        True
    """
    q, k = dpsgd_schedule(sampling_rate=sampling_rate, steps=steps,
                          dataset_size=dataset_size, batch_size=batch_size, epochs=epochs)
    target = check_epsilon(target_epsilon, "target_epsilon")
    if target == 0:
        raise InvalidCostError("target_epsilon", target_epsilon, "must be > 0")
    delta = check_delta(target_delta, "target_delta")
    _check_accountant(accountant, delta)
    tol = float(check_positive(tolerance, "tolerance"))
    cap = float_down(target)
    interval = value_discretization_interval
    evaluations = [0]

    def _epsilon_told(q: Fraction, sigma: float, k: int, delta: Fraction, accountant: str,
                      interval: Any, refine: bool = True) -> float:
        value = _epsilon(q, sigma, k, delta, accountant, interval, refine=refine)
        evaluations[0] += 1
        if progress is not None:
            progress(evaluations[0], None)
        return value

    def fits_rdp(sigma: float) -> bool:
        # The integer orders alone give a valid bound in microseconds; the fractional
        # search runs only where that bound does not already fit.
        if _epsilon_told(q, sigma, k, delta, "rdp", interval, refine=False) <= cap:
            return True
        return _epsilon_told(q, sigma, k, delta, "rdp", interval) <= cap

    known: dict[float, float] = {}

    def eps_pld(sigma: float) -> float:
        if sigma not in known:
            known[sigma] = _epsilon_told(q, sigma, k, delta, "pld", interval)
        return known[sigma]

    def fits(sigma: float) -> bool:
        if accountant == "pld":
            return eps_pld(sigma) <= cap
        return _epsilon_told(q, sigma, k, delta, accountant, interval) <= cap

    if accountant == "rdp":
        sigma = _smallest_fitting(fits_rdp, tol, 1.0, target_epsilon)
    else:
        try:  # the RDP answer fits the PLD too: the PLD search starts there
            start = _smallest_fitting(fits_rdp, tol, 1.0, target_epsilon) if delta else 1.0
        except InvalidCostError:
            start = 1.0
        sigma = _interpolated_search(eps_pld, cap, start, tol, target_epsilon)
    if not fits(sigma):  # pragma: no cover - defensive re-check
        raise InvalidCostError("target_epsilon", target_epsilon, "calibration failed")
    return sigma
