"""The Laplace mechanism, implemented exactly on a lattice (pure epsilon-DP).

The textbook mechanism adds Laplace noise of scale sensitivity / epsilon to an answer
with L1 sensitivity ``sensitivity`` and is epsilon-DP (Dwork, McSherry, Nissim and Smith
2006; Dwork and Roth 2014, Thm 3.6). Floating-point Laplace samplers leak the answer
through the low bits of the output (Mironov 2012), so this implementation never adds a
float sample:

1. the answer is rounded to the lattice ``g * Z^d`` (spacing ``granularity`` g);
2. integer noise from the *discrete* Laplace, P[Y = y] ∝ exp(-|y| / b), is added in each
   coordinate, drawn exactly (Canonne, Kamath and Steinke 2020, Algorithm 2);
3. the lattice point is returned as ``k * g``.

What is charged. Rounding moves each coordinate by at most g/2, so two neighbouring
answers with ``||a - a'||_1 <= sensitivity`` land on lattice points whose integer
difference v satisfies ``||v||_1 <= sensitivity / g + d``; being an integer,
``||v||_1 <= S := floor(sensitivity / g) + d`` (the *lattice sensitivity*). For the
product discrete Laplace, |y| - |y - v| <= |v| coordinate-wise (triangle inequality), so
the density ratio is at most exp(S / b). The lattice scale is set to b = S / epsilon
exactly, hence the mechanism is *exactly* the requested epsilon-DP, for any adaptivity
(it is one mechanism; composition is the accountant's business), and the charge is
``DiscreteLaplaceCharge(b, S, dimension)``, whose cost is ``PrivacyCost(epsilon)``
exactly (S / b = epsilon).

Why not a `LaplaceCharge`: tight engines (PLD) read a
LaplaceCharge as *continuous* Laplace noise, and the discrete Laplace is not dominated
by it (at shift 1 its total-variation distance is tanh(epsilon/2) > 1 - exp(-epsilon/2)).
The `DiscreteLaplaceCharge` describes the lattice sampler
itself, so the PLD engine can use its exact discrete privacy loss distribution.

The default granularity is the largest power of two <= sensitivity / (1024 d), so the
noise scale ``b * g`` exceeds the continuous sensitivity / epsilon by at most ~0.2 %.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpaccount._numeric import check_positive, float_up
from dpaccount.charges import DiscreteLaplaceCharge
from dpaccount.errors import InvalidCostError
from dpaccount.mechanisms._sampling import (
    RandomSource,
    check_dimension,
    from_lattice,
    power_of_two_at_most,
    resolve_rng,
    sample_discrete_laplace,
    to_lattice,
)
from dpaccount.mechanisms.base import Mechanism

__all__ = ["LaplaceMechanism"]

#: Default lattice: granularity <= sensitivity / (_FINENESS * dimension).
_FINENESS = 1024


class LaplaceMechanism(Mechanism):
    """Discrete Laplace noise on a lattice: exactly epsilon-DP for an L1-sensitivity query.

    Theorem: Dwork and Roth 2014, Thm 3.6 (Laplace mechanism), in its discrete form
    (Ghosh, Roughgarden and Sundararajan 2009; Canonne, Kamath and Steinke 2020, sampler
    Algorithm 2); see the module docstring for the lattice-rounding argument. It is one
    mechanism with fixed parameters; charge it through an accountant for composition.

    Args:
        epsilon: The privacy parameter, > 0.
        sensitivity: The L1 sensitivity of the query over the accountant's neighbouring
            relation, > 0 (it must hold for the float answers passed to ``release``).
        dimension: The number of coordinates of the answer (1 for a scalar).
        granularity: Lattice spacing g > 0; default the largest power of two
            <= sensitivity / (1024 * dimension). Powers of two round exactly and fast.
        rng: ``None`` for the OS CSPRNG; a ``RandomSource.seeded(...)`` in tests only.

    Raises:
        InvalidCostError: For an invalid parameter (naming it).

    Examples:
        >>> from dpaccount.mechanisms._sampling import RandomSource
        >>> m = LaplaceMechanism(1, 1, rng=RandomSource.seeded(0))
        >>> m.charge.cost
        PrivacyCost(epsilon=1, delta=0)
        >>> m.charge.scale == m.lattice_scale, m.charge.sensitivity
        (True, Fraction(1025, 1))
        >>> m.lattice_sensitivity, m.granularity      # floor(1 / 2**-10) + 1
        (1025, Fraction(1, 1024))
        >>> 1.0 < m.scale < 1.001                     # vs. continuous scale 1
        True
        >>> isinstance(m.release(42.0), float)
        True
    """

    def __init__(
        self,
        epsilon: Any,
        sensitivity: Any,
        *,
        dimension: int = 1,
        granularity: Any = None,
        rng: Any = None,
    ) -> None:
        self._epsilon = check_positive(epsilon, "epsilon")
        self._sensitivity = check_positive(sensitivity, "sensitivity")
        self._dimension = check_dimension(dimension)
        if granularity is None:
            self._granularity = power_of_two_at_most(
                self._sensitivity / (_FINENESS * self._dimension)
            )
        else:
            self._granularity = check_positive(granularity, "granularity")
        self._lattice_sensitivity = (
            math.floor(self._sensitivity / self._granularity) + self._dimension
        )
        self._lattice_scale = Fraction(self._lattice_sensitivity) / self._epsilon
        self._rng: RandomSource = resolve_rng(rng)
        self._charge = DiscreteLaplaceCharge(
            self._lattice_scale, self._lattice_sensitivity, self._dimension
        )

    @property
    def charge(self) -> DiscreteLaplaceCharge:
        """``DiscreteLaplaceCharge(b, S, dimension)``, lattice units; its cost is exactly
        ``PrivacyCost(epsilon)``."""
        return self._charge

    @property
    def epsilon(self) -> Fraction:
        """The (exact) epsilon of one release."""
        return self._epsilon

    @property
    def sensitivity(self) -> Fraction:
        """The declared L1 sensitivity."""
        return self._sensitivity

    @property
    def dimension(self) -> int:
        """The number of coordinates ``release`` expects."""
        return self._dimension

    @property
    def granularity(self) -> Fraction:
        """The lattice spacing g: outputs are multiples of g."""
        return self._granularity

    @property
    def lattice_sensitivity(self) -> int:
        """S = floor(sensitivity / g) + dimension: the L1 sensitivity in lattice steps."""
        return self._lattice_sensitivity

    @property
    def lattice_scale(self) -> Fraction:
        """b = S / epsilon: the discrete Laplace parameter, in lattice steps."""
        return self._lattice_scale

    @property
    def scale(self) -> float:
        """The noise scale in the answer's units, b * g (rounded up)."""
        return float_up(self._lattice_scale * self._granularity)

    def release(self, value: Any) -> Any:
        """The answer rounded to the lattice plus discrete Laplace noise.

        Args:
            value: A finite real number, or an array of ``dimension`` of them.

        Returns:
            A float for a scalar input, else a plain float64 numpy array of the input's
            shape. Only the noised numbers come out: a pandas Series' or DataFrame's
            index, name and columns, a structured array's fields and any other label
            are dropped (labels computed from data are data; a guard gives declared
            labels back, see `dpaccount.mechanisms.labels`).
        """
        k, shape = to_lattice(value, self._granularity, self._dimension)
        noisy = [x + sample_discrete_laplace(self._lattice_scale, self._rng) for x in k]
        return from_lattice(noisy, self._granularity, shape)

    def noise_tail(self, threshold: Any) -> float:
        """P[|noise| > threshold] in one coordinate (an upper bound, as a float).

        For the discrete Laplace with q = exp(-1/b), P[|Y| >= m] = 2 q^m / (1 + q) for
        m >= 1.
        """
        t = check_positive(threshold, "threshold") / self._granularity
        m = math.floor(t) + 1
        q = math.exp(-1.0 / float(self._lattice_scale))
        return min(1.0, 2.0 * q**m / (1.0 + q) * (1 + 1e-12))

    def error_bound(self, level: Any = 0.95) -> float:
        """Half-width w with P[|noise| <= w] >= level in one coordinate.

        Examples:
            >>> m = LaplaceMechanism(1, 1)
            >>> 2.99 < m.error_bound(0.95) < 3.01       # continuous: ln(20) = 2.996
            True
        """
        lvl = check_positive(level, "level")
        if lvl >= 1:
            raise InvalidCostError("level", level, "must be in (0, 1)")
        b = float(self._lattice_scale)
        q = math.exp(-1.0 / b)
        # smallest m >= 1 with 2 q^m / (1 + q) <= 1 - level, then w = (m - 1) * g.
        target = (1.0 - float(lvl)) * (1.0 + q) / 2.0
        m = max(1, math.ceil(math.log(target) / math.log(q) * (1 + 1e-12)))
        while 2.0 * q**m / (1.0 + q) > 1.0 - float(lvl):
            m += 1
        return float((m - 1) * self._granularity)

    def confidence_interval(self, released: Any, level: Any = 0.95) -> tuple[Any, Any]:
        """Per-coordinate interval around a released value that covers the true answer
        (up to lattice rounding, g/2) with probability >= level.
        """
        w = self.error_bound(level) + float(self._granularity) / 2
        arr: float | npt.NDArray[np.float64] = (
            np.asarray(released, dtype=np.float64) if np.ndim(released) else float(released)
        )
        return arr - w, arr + w

    def __repr__(self) -> str:
        return (
            f"LaplaceMechanism(epsilon={float(self._epsilon)!r}, "
            f"sensitivity={float(self._sensitivity)!r}, dimension={self._dimension}, "
            f"granularity={self._granularity})"
        )
