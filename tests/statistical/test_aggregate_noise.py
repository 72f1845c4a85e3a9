"""Statistical tests of the integer noise behind the guarded aggregates.

False-positive rate: every goodness-of-fit test and audit runs at alpha = 1e-6 (a correct
implementation fails with probability at most 1e-6 for a fresh seed); seeds are fixed
through the test-only ``RandomSource.seeded``.

Expected distributions are derived independently: the discrete Laplace of scale b has
P[Y = k] = (1 - r) / (1 + r) r^|k| with r = exp(-1/b) (geometric series); the discrete
Gaussian P[Y = k] ∝ exp(-k² / (2 s²)), normalised numerically over |k| <= 40 s + 40.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from _audit import chi_square_gof, run_audit, threshold_events

from dpaccount import Accountant, Budget
from dpaccount import aggregates as agg
from dpaccount.mechanisms import RandomSource

ALPHA = 1e-6
N = 20_000


def _laplace_pmf(scale: float) -> Any:
    r = math.exp(-1.0 / scale)

    def pmf(k: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return (1 - r) / (1 + r) * r ** np.abs(k).astype(np.float64)

    return pmf


def _gaussian_pmf(s2: float) -> Any:
    span = int(40 * math.sqrt(s2)) + 40
    ks = np.arange(-span, span + 1, dtype=np.float64)
    z = float(np.sum(np.exp(-(ks * ks) / (2 * s2))))

    def pmf(k: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        kf = k.astype(np.float64)
        return np.exp(-(kf * kf) / (2 * s2)) / z

    return pmf


def _draws(mech: Any, value: int, n: int) -> npt.NDArray[np.int64]:
    return np.asarray(mech.release([value] * n), dtype=np.int64)


def test_integer_laplace_is_the_discrete_laplace() -> None:
    mech = agg.IntegerLaplaceMechanism("0.5", 3, rng=RandomSource.seeded(1))
    res = chi_square_gof(_draws(mech, 0, N), _laplace_pmf(6.0), (-60, 60), alpha=ALPHA)
    assert res.passed


def test_integer_gaussian_is_the_discrete_gaussian() -> None:
    mech = agg.IntegerGaussianMechanism(1, "1e-5", 2, rng=RandomSource.seeded(2))
    s2 = float(mech.sigma2)
    lim = int(6 * math.sqrt(s2))
    res = chi_square_gof(_draws(mech, 0, N), _gaussian_pmf(s2), (-lim, lim), alpha=ALPHA)
    assert res.passed


LAPLACE_EVENTS = threshold_events([-1.5, -0.5, 0.5, 1.5, 2.5])


def test_integer_laplace_audit_passes_and_has_power() -> None:
    mech = agg.IntegerLaplaceMechanism(1, 1, rng=RandomSource.seeded(3))
    res = run_audit(lambda n: _draws(mech, 0, n), lambda n: _draws(mech, 1, n), N,
                    LAPLACE_EVENTS, alpha=ALPHA)
    assert 0.8 < res.epsilon_lower_bound <= 1.0


class _HalfScaleLaplace(agg.IntegerLaplaceMechanism):
    """Mutant: half the noise scale, same charge."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scale = self._scale / 2


def test_integer_laplace_audit_catches_half_the_noise() -> None:
    mech = _HalfScaleLaplace(1, 1, rng=RandomSource.seeded(4))
    res = run_audit(lambda n: _draws(mech, 0, n), lambda n: _draws(mech, 1, n), N,
                    LAPLACE_EVENTS, alpha=ALPHA)
    assert res.epsilon_lower_bound > 1.0


def test_integer_laplace_audit_catches_a_sensitivity_off_by_one() -> None:
    # Declared sensitivity 1; the answers really differ by 2.
    mech = agg.IntegerLaplaceMechanism(1, 1, rng=RandomSource.seeded(5))
    res = run_audit(lambda n: _draws(mech, 0, n), lambda n: _draws(mech, 2, n), N,
                    threshold_events([-0.5, 0.5, 1.5, 2.5, 3.5]), alpha=ALPHA)
    assert res.epsilon_lower_bound > 1.0


GAUSS_EPS, GAUSS_DELTA = 2.0, 1e-3


def test_integer_gaussian_audit_passes() -> None:
    mech = agg.IntegerGaussianMechanism(GAUSS_EPS, GAUSS_DELTA, 1, rng=RandomSource.seeded(6))
    events = threshold_events([0.5 + k for k in range(-3, 4)])
    res = run_audit(lambda n: _draws(mech, 0, n), lambda n: _draws(mech, 1, n), N, events,
                    delta=float(mech.charge.delta), alpha=ALPHA)
    assert res.epsilon_lower_bound <= GAUSS_EPS


class _HalfSigmaGaussian(agg.IntegerGaussianMechanism):
    """Mutant: sigma halved (sigma² / 4) after calibration, same charge."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sigma2 = self._sigma2 / 4


def test_integer_gaussian_audit_catches_half_the_noise() -> None:
    # At (2, 1e-3) and shift 1 the calibrated s is about 1.46 lattice steps; with s
    # halved, one step is about 1.4 s, and the tail events {Y >= t} differ between the
    # neighbours by a ratio far above e².
    mech = _HalfSigmaGaussian(GAUSS_EPS, GAUSS_DELTA, 1, rng=RandomSource.seeded(7))
    events = threshold_events([0.5 + k for k in range(-3, 4)])
    res = run_audit(lambda n: _draws(mech, 0, n), lambda n: _draws(mech, 1, n), N, events,
                    delta=float(mech.charge.delta), alpha=ALPHA)
    assert res.epsilon_lower_bound > GAUSS_EPS


def test_guarded_count_end_to_end_audit() -> None:
    # Neighbours under add/remove: 50 records and 51 records.
    acct = Accountant(Budget.unlimited())
    rng = RandomSource.seeded(8)

    def sample(n_records: int) -> Any:
        data = np.zeros(n_records)
        return lambda n: np.array([agg.count(data, acct, 1, rng=rng).value for _ in range(n)])

    res = run_audit(sample(50), sample(51), 10_000,
                    threshold_events([48.5, 49.5, 50.5, 51.5, 52.5]), alpha=ALPHA)
    assert res.epsilon_lower_bound <= 1.0
