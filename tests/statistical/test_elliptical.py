"""Statistical tests of the elliptical Gaussian mechanism.

False-positive rate: every goodness-of-fit test and audit runs at alpha = 1e-6 (a
correct implementation fails with probability at most 1e-6 for a fresh seed); seeds are
fixed through the test-only ``RandomSource.seeded``.

Expected distributions are derived independently: coordinate j's noise, in lattice units,
is the discrete Gaussian P[Y = y] ∝ exp(-y² / (2 t_j²)) (normalised numerically over
|y| <= 40 t_j, which leaves out less than 1e-300 of the mass). The audit uses the optimal
test for a Gaussian shift v: the statistic z = sum_j v_j y_j / sigma_j², normalised by
its standard deviation, thresholded at fixed points (chosen before sampling).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from _audit import chi_square_gof, run_audit

from dpaccount.errors import InvalidCostError, UnreleasableResultError
from dpaccount.mechanisms import RandomSource
from dpaccount.mechanisms.elliptical import (
    EllipticalGaussianMechanism,
    elliptical_error_ratio,
)
from dpaccount.mechanisms.gaussian import GaussianMechanism

ALPHA = 1e-6
EPS, DELTA = 2.0, 1e-3
BOUNDS = [1.0, 2.0]
THRESHOLDS = [1.0, 1.5, 2.0, 2.25, 2.5, 2.75, 3.0]
#: Mutant audits: each mutant doubles the rescaled sensitivity D (0.62 -> 1.24 at
#: eps = 2, delta = 1e-3), which the events z >= 2.25..2.75 expose with 25 000 samples a side
#: (certified lower bounds 2.27-2.49 against the claimed 2 at seeds 7, 8, 10).
N_MUTANT = 25_000


def _events(mech: EllipticalGaussianMechanism, shift: list[float]) -> dict[str, Any]:
    v = np.asarray(shift)
    w = v / mech.sigmas**2
    norm = float(np.sqrt(np.sum(v * v / mech.sigmas**2)))
    events: dict[str, Any] = {}
    for t in THRESHOLDS:
        events[f"z>={t}"] = lambda x, t=t: (x @ w) / norm >= t
        events[f"z<={-t}"] = lambda x, t=t: (x @ w) / norm <= -t
    return events


def _audit(mech: EllipticalGaussianMechanism, shift: list[float], n: int) -> float:
    zero = np.zeros(len(shift))
    events = _events(mech, shift)
    res = run_audit(
        lambda k: np.array([mech.release(zero) for _ in range(k)]),
        lambda k: np.array([mech.release(shift) for _ in range(k)]),
        n,
        events,
        delta=float(mech.charge.delta),
        alpha=ALPHA,
    )
    return res.epsilon_lower_bound


def test_each_coordinate_is_the_stated_discrete_gaussian() -> None:
    mech = EllipticalGaussianMechanism(EPS, DELTA, [1.0, 16.0], rng=RandomSource.seeded(4))
    samples = np.array([mech.release([0.0, 0.0]) for _ in range(6000)])
    for j, (g, t2) in enumerate(zip(mech.granularity, mech.lattice_sigma2, strict=True)):
        ints = np.rint(samples[:, j] / float(g)).astype(np.int64)
        s2 = float(t2)
        span = int(40 * math.sqrt(s2)) + 1
        ys = np.arange(-span, span + 1, dtype=np.float64)
        z = float(np.sum(np.exp(-(ys * ys) / (2 * s2))))

        def pmf(y: npt.NDArray[np.int64], s2: float = s2, z: float = z) -> Any:
            yf = y.astype(np.float64)
            return np.exp(-(yf * yf) / (2 * s2)) / z

        lim = int(6 * math.sqrt(s2))
        assert chi_square_gof(ints, pmf, (-lim, lim), alpha=ALPHA).passed


def test_noise_scales_follow_sqrt_of_the_bounds() -> None:
    mech = EllipticalGaussianMechanism(1, "1e-6", [1.0, 4.0, 64.0])
    s = mech.sigmas
    # sigma_j² ∝ S_j g_j (the lattice bound), within a lattice step of Delta_j.
    assert s[1] / s[0] == pytest.approx(2.0, rel=1e-2)
    assert s[2] / s[0] == pytest.approx(8.0, rel=1e-2)


def test_beats_the_isotropic_gaussian_by_the_closed_form_ratio() -> None:
    bounds = [1.0, 1.0, 4.0, 16.0]
    ell = EllipticalGaussianMechanism(1, "1e-6", bounds)
    iso = GaussianMechanism(1, "1e-6", float(np.linalg.norm(bounds)), dimension=len(bounds))
    ratio = ell.expected_squared_error / (len(bounds) * iso.sigma**2)
    # (sum Delta)² / (d sum Delta²) = 22² / (4 * 274) = 0.4416; lattice rounding and the
    # isotropic mechanism's sqrt(d) lattice slack move it by a few percent.
    assert ratio == pytest.approx(22**2 / (4 * 274), rel=0.05)
    assert elliptical_error_ratio(bounds) == pytest.approx(22**2 / (4 * 274))


def test_audit_passes_at_the_box_corner() -> None:
    mech = EllipticalGaussianMechanism(EPS, DELTA, BOUNDS, rng=RandomSource.seeded(6))
    assert float(mech.charge.delta) <= DELTA
    lower = _audit(mech, BOUNDS, 20_000)
    assert lower <= EPS


class _HalfNoise(EllipticalGaussianMechanism):
    """Mutant: after calibration, sigma is halved (t² / 4); the charge is unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._t2 = [t / 4 for t in self._t2]


class _MissingSqrt(EllipticalGaussianMechanism):
    """Mutant: after calibration, sigma_j ∝ Delta_j instead of sqrt(Delta_j), with the
    same total noise variance; the charge is unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        var = [float(g) ** 2 * float(t) for g, t in zip(self._g, self._t2, strict=True)]
        weights = [float(b) ** 2 for b in self._bounds]
        scale = sum(var) / sum(weights)
        self._t2 = [
            Fraction(w * scale) / (g * g) for w, g in zip(weights, self._g, strict=True)
        ]


@pytest.mark.slow
def test_audit_catches_half_the_noise() -> None:
    mech = _HalfNoise(EPS, DELTA, BOUNDS, rng=RandomSource.seeded(7))
    assert _audit(mech, BOUNDS, N_MUTANT) > EPS


@pytest.mark.slow
def test_audit_catches_a_missing_square_root() -> None:
    # D² grows by d sum Delta² / (sum Delta)² = 4 (3 + 1024²) / 1027² ~ 3.98: D doubles.
    bounds = [1.0, 1.0, 1.0, 1024.0]
    mech = _MissingSqrt(EPS, DELTA, bounds, rng=RandomSource.seeded(8))
    assert _audit(mech, bounds, N_MUTANT) > EPS


@pytest.mark.slow
def test_audit_catches_a_sensitivity_off_by_one() -> None:
    # Two counts declared with bound 1 that really move by 2: D doubles.
    mech = EllipticalGaussianMechanism(EPS, DELTA, [1.0, 1.0], rng=RandomSource.seeded(10))
    assert _audit(mech, [2.0, 2.0], N_MUTANT) > EPS


def test_invalid_parameters_are_refused() -> None:
    for bad in ([], [1.0, -1.0], [1.0, float("nan")], "12", [[1.0]]):
        with pytest.raises(InvalidCostError):
            EllipticalGaussianMechanism(1, "1e-6", bad)
    with pytest.raises(InvalidCostError):
        EllipticalGaussianMechanism(1, 0, [1.0])
    mech = EllipticalGaussianMechanism(1, "1e-6", [1.0, 2.0])
    for value in ([1.0], [1.0, float("inf")], [[1.0, 2.0]], ["a", "b"]):
        with pytest.raises(UnreleasableResultError):
            mech.release(value)
