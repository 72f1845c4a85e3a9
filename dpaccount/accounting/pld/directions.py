"""What a privacy loss distribution holds: four discretisations and certified loss facts.

`_Directions` holds the pessimistic (upper) and optimistic (lower) discretisations
(`dpaccount.accounting.pld.discrete`) of the two directions of an add/remove pair, and
`_Support` what is certified exactly about the largest finite loss and the mass at
+infinity (which makes the pure-DP answer at delta = 0 exact). Both are composed by
`dpaccount.accounting.pld.distribution.PrivacyLossDistribution` and built by
`dpaccount.accounting.pld.build`.
"""

from __future__ import annotations

from fractions import Fraction

import attrs

from dpaccount.accounting.pld.discrete import DiscretePLD

#: Bits kept by `_Support` when a survival probability's exact denominator grows.
_SURVIVAL_BITS = 256


def _round_down(value: Fraction) -> Fraction:
    """``value`` rounded down to a multiple of 2^-256 once its denominator is larger."""
    if value.denominator.bit_length() <= _SURVIVAL_BITS:
        return value
    scale = 1 << _SURVIVAL_BITS
    return Fraction(value.numerator * scale // value.denominator, scale)


@attrs.frozen
class _Support:
    """Certified facts about the privacy loss of a pair with bounded finite losses.

    Every finite loss is at most ``top`` and P(L = +inf) is at most ``1 - survival``,
    so delta(eps) <= 1 - survival for eps >= top, and epsilon(delta) <= top for
    delta >= 1 - survival. Both are exact rationals (rounded toward more privacy loss:
    ``top`` up, ``survival`` down), so the pure-DP answer at delta = 0 is exact where
    the grid's floating-point allowances cannot reach it. Under composition the
    finite losses add and the mass at +inf composes as 1 - prod(1 - m_i) (the losses
    of a product pair add; Dong, Roth and Su 2019, Thm 3.2; Zhu, Dong and Wang 2022,
    Thm 10 for adaptive composition).
    """

    top: Fraction
    survival: Fraction

    def compose(self, other: _Support) -> _Support:
        return _Support(self.top + other.top, _round_down(self.survival * other.survival))

    def power(self, count: int) -> _Support:
        survival, base, k = Fraction(1), self.survival, count
        while k:
            if k & 1:
                survival = _round_down(survival * base)
            k >>= 1
            if k:
                base = _round_down(base * base)
        return _Support(self.top * count, survival)

    def epsilon_cap(self, delta: Fraction) -> Fraction | None:
        """``top`` if ``delta`` covers the mass at +inf, else None (no cap)."""
        return self.top if delta >= 1 - self.survival else None


def _compose_support(a: _Support | None, b: _Support | None) -> _Support | None:
    return None if a is None or b is None else a.compose(b)


@attrs.frozen(eq=False)
class _Directions:
    """The four discretisations of one privacy loss distribution.

    ``remove``/``add`` are the two orders of an add/remove pair; where one discretisation
    serves both orders (a symmetric mechanism, or the symmetrised upper bound of
    sampling without replacement) the two fields hold the same object, composed once.
    The upper and the lower ends are symmetric or not independently.
    """

    upper_remove: DiscretePLD
    upper_add: DiscretePLD
    lower_remove: DiscretePLD | None
    lower_add: DiscretePLD | None
    support_remove: _Support | None = None
    support_add: _Support | None = None

    @property
    def symmetric(self) -> bool:
        return self.upper_remove is self.upper_add

    @property
    def lower_symmetric(self) -> bool:
        return self.lower_remove is self.lower_add

