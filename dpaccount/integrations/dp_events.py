"""dp_accounting's ``DpEvent`` trees as dpaccount charges, and back.

Teams that describe their mechanisms as Google dp_accounting ``DpEvent`` trees (TF
Privacy, JAX privacy code) hand them to a ledger with `charges_from_dp_event` (one charge
per part of a top-level composition) or `from_dp_event` (exactly one charge), and turn a
dpaccount charge into a ``DpEvent`` with `to_dp_event` for a peer accountant.

The translation is exact where both sides describe the same mechanism, and otherwise
conservative: a parameter that must become a float is rounded toward *more* privacy
loss (a noise multiplier down, a sampling probability up), so the event a peer composes
is never more private than the charge, and the charge a ledger records is never more
private than the event. An event that dpaccount cannot express is refused by name with
`UnsupportedChargeError` before anything is charged; nothing is approximated silently.

What each event becomes (dp_accounting 0.4 and later):

* ``NoOpDpEvent``: ``PrivacyCost(0)``.
* ``GaussianDpEvent(m)``: ``GaussianCharge(sigma=m, sensitivity=1,
  epsilon=gaussian_epsilon)``.
* ``LaplaceDpEvent(m)``: ``LaplaceCharge(scale=m, sensitivity=1)``.
* ``DiscreteLaplaceDpEvent(a, S)``: ``DiscreteLaplaceCharge(scale=1/a, sensitivity=S)``.
* ``RandomizedResponseDpEvent(p, k)``: ``RandomizedResponseCharge(ε, k)`` with
  ε = ln(1 + k(1 - p)/p) rounded up.
* ``PoissonSampledDpEvent(q, e)``: ``Subsampled(e, q, Scheme.POISSON)``.
* ``SampledWithoutReplacementDpEvent(n, m, e)``: ``Subsampled(e, m/n,
  Scheme.WITHOUT_REPLACEMENT)``.
* ``SelfComposedDpEvent(e, k)``: ``Repeated(e, k)``.
* ``ComposedDpEvent([e1, ...])``: one charge per part (`charges_from_dp_event`);
  ``Repeated`` when the parts are equal.
* ``RepeatAndSelectDpEvent(e, mean, shape)``: ``RepeatAndSelect(e, mean, "poisson")``
  for shape = inf, else ``RepeatAndSelect(e, mean, "truncated_negative_binomial",
  shape, delta=selection_delta)``.
* ``MixtureOfGaussiansDpEvent(s, c, p)``: ``MixtureOfGaussiansCharge(s, c, p,
  epsilon=gaussian_epsilon)``, the probabilities taken at their shortest decimal form
  (``repr``: their binary values need not sum to exactly 1), refused unless those sum
  to 1.
* ``NonPrivateDpEvent``, ``UnsupportedDpEvent``: refused (no finite guarantee).
* ``SampledWithReplacementDpEvent``, ``TruncatedSubsampledGaussianDpEvent``,
  ``SingleEpochTreeAggregationDpEvent``, ``ZCDpEvent``: refused by name (no dpaccount
  charge describes them yet).

Semantics carried over: dp_accounting's noise multiplier is the noise's standard
deviation (or Laplace scale) over the query's sensitivity under the relation the
accountant uses; dpaccount's charges are stated under the ledger's relation in the same
way, so sensitivity 1 and the multiplier as the noise keep the meaning. Each part of a
``ComposedDpEvent`` becomes its own record: charging them one by one is sequential
composition, adaptive as the rules allow, but not all or nothing (charge first, never
refund: a part that does not fit is refused and the earlier parts stay charged). Use
`from_dp_event` where one atomic charge is needed.

dp_accounting is an optional extra (``pip install "dpaccount[dp-accounting]"``), imported
only by this module.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from dpaccount._numeric import exp_up, float_down, float_up, log_up
from dpaccount.charges import (
    Charge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    RandomizedResponseCharge,
    RepeatAndSelect,
    Repeated,
    Scheme,
    Subsampled,
)
from dpaccount.costs import PrivacyCost
from dpaccount.errors import InvalidCostError, UnsupportedChargeError, missing_extra

try:
    from dp_accounting import dp_event as _events
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise missing_extra("dp_accounting", "dp-accounting") from error

__all__ = ["charges_from_dp_event", "from_dp_event", "to_dp_event"]

#: Events dp_accounting composes that no dpaccount charge describes yet (refused by name).
_NOT_YET = (
    "SampledWithReplacementDpEvent",
    "TruncatedSubsampledGaussianDpEvent",
    "SingleEpochTreeAggregationDpEvent",
    "ZCDpEvent",
)


def charges_from_dp_event(event: Any, *, gaussian_epsilon: Any = 1,
                          selection_delta: Any = 0) -> list[Charge]:
    """The dpaccount charges of a ``DpEvent`` tree, one per part of its composition.

    A ``ComposedDpEvent`` at the top (nested compositions flattened) gives one charge
    per part, in order; charge them one after the other (sequential composition). Any
    other event gives one charge (`from_dp_event`).

    Args:
        event: A dp_accounting ``DpEvent``.
        gaussian_epsilon: The point of each Gaussian's privacy profile at which its
            (ε, δ(ε)) cost is reported to rules that add (ε, δ) pairs (basic, advanced,
            filters); the tight rules (pld, rdp, gdp, zcdp) use σ and ignore it.
        selection_delta: The δ at which a repeat-and-select's (ε, δ) cost is stated
            where no pure bound holds (`RepeatAndSelect`'s ``delta``); the RDP engine
            ignores it. 0 (the default) suffices for a pure run with a truncated
            negative binomial count; otherwise such an event needs it.

    Raises:
        UnsupportedChargeError: A part dpaccount cannot express, named.
        InvalidCostError: A parameter outside its range (a noise multiplier ≤ 0 on a
            mechanism that needs noise, a probability outside [0, 1], ...), named.

    Examples:
        >>> from dp_accounting import dp_event
        >>> event = dp_event.ComposedDpEvent([dp_event.LaplaceDpEvent(2.0),
        ...                                   dp_event.GaussianDpEvent(4.0)])
        >>> [type(c).__name__ for c in charges_from_dp_event(event)]
        ['LaplaceCharge', 'GaussianCharge']
    """
    if isinstance(event, _events.ComposedDpEvent):
        parts: list[Charge] = []
        for part in event.events:
            parts += charges_from_dp_event(part, gaussian_epsilon=gaussian_epsilon,
                                           selection_delta=selection_delta)
        return parts
    return [from_dp_event(event, gaussian_epsilon=gaussian_epsilon,
                          selection_delta=selection_delta)]


def from_dp_event(event: Any, *, gaussian_epsilon: Any = 1, selection_delta: Any = 0
                  ) -> Charge:
    """One dpaccount charge that describes a ``DpEvent`` tree exactly or conservatively.

    See the module's table for each event. A ``ComposedDpEvent`` becomes one charge only
    when its parts are all the same event (``Repeated``); otherwise use
    `charges_from_dp_event`.

    Raises:
        UnsupportedChargeError: An event dpaccount cannot express (named), or a
            composition of different parts.
        InvalidCostError: A parameter outside its range, named.

    Examples:
        >>> from dp_accounting import dp_event
        >>> c = from_dp_event(dp_event.SelfComposedDpEvent(
        ...     dp_event.PoissonSampledDpEvent(0.5, dp_event.LaplaceDpEvent(4.0)), 10))
        >>> c.count, c.charge.rate, c.charge.scheme.value, c.charge.charge.scale
        (10, Fraction(1, 2), 'poisson', Fraction(4, 1))
    """
    return _from(event, gaussian_epsilon, "event", selection_delta)


def _from(event: Any, eps: Any, where: str, selection_delta: Any) -> Charge:
    kind = type(event).__name__
    if not isinstance(event, _events.DpEvent):
        raise UnsupportedChargeError(
            f"{where} is a {kind}, not a dp_accounting DpEvent")
    if isinstance(event, _events.NoOpDpEvent):
        return PrivacyCost(0)
    if isinstance(event, (_events.NonPrivateDpEvent, _events.UnsupportedDpEvent)):
        raise UnsupportedChargeError(
            f"{where} is a {kind}: it has no finite privacy guarantee, and no ledger can "
            "charge it")
    if kind in _NOT_YET:
        raise UnsupportedChargeError(
            f"{where} is a {kind}: dpaccount has no charge that describes it yet, so it "
            "is refused rather than approximated")
    if isinstance(event, _events.GaussianDpEvent):
        sigma = _noise(event.noise_multiplier, f"{where}.noise_multiplier", kind)
        return GaussianCharge(sigma=sigma, sensitivity=1, epsilon=eps)
    if isinstance(event, _events.LaplaceDpEvent):
        scale = _noise(event.noise_multiplier, f"{where}.noise_multiplier", kind)
        return LaplaceCharge(scale=scale, sensitivity=1)
    if isinstance(event, _events.DiscreteLaplaceDpEvent):
        a = _noise(event.noise_parameter, f"{where}.noise_parameter", kind)
        return DiscreteLaplaceCharge(scale=1 / a, sensitivity=_count(
            event.sensitivity, f"{where}.sensitivity", 1))
    if isinstance(event, _events.RandomizedResponseDpEvent):
        return _randomized_response(event, where)
    if isinstance(event, _events.MixtureOfGaussiansDpEvent):
        sigma = _noise(event.standard_deviation, f"{where}.standard_deviation", kind)
        sensitivities = [_number(c, f"{where}.sensitivities") for c in event.sensitivities]
        probabilities = [_decimal(q, f"{where}.sampling_probs") for q in event.sampling_probs]
        return MixtureOfGaussiansCharge(sigma, sensitivities, probabilities, eps)
    if isinstance(event, _events.RepeatAndSelectDpEvent):
        inner = _from(event.event, eps, f"{where}.event", selection_delta)
        mean = _number(event.mean, f"{where}.mean")
        if isinstance(event.shape, float) and event.shape == math.inf:
            return RepeatAndSelect(inner, mean, "poisson", delta=selection_delta)
        shape = _number(event.shape, f"{where}.shape")
        return RepeatAndSelect(inner, mean, "truncated_negative_binomial", shape,
                               delta=selection_delta)
    if isinstance(event, _events.PoissonSampledDpEvent):
        q = _probability(event.sampling_probability, f"{where}.sampling_probability")
        inner = _from(event.event, eps, f"{where}.event", selection_delta)
        return PrivacyCost(0) if q == 0 else Subsampled(inner, q, Scheme.POISSON)
    if isinstance(event, _events.SampledWithoutReplacementDpEvent):
        n = _count(event.source_dataset_size, f"{where}.source_dataset_size", 1)
        m = _count(event.sample_size, f"{where}.sample_size", 0)
        if m > n:
            raise InvalidCostError(f"{where}.sample_size", m,
                                   "must be at most the source_dataset_size")
        inner = _from(event.event, eps, f"{where}.event", selection_delta)
        return PrivacyCost(0) if m == 0 else Subsampled(
            inner, Fraction(m, n), Scheme.WITHOUT_REPLACEMENT)
    if isinstance(event, _events.SelfComposedDpEvent):
        count = _count(event.count, f"{where}.count", 0)
        inner = _from(event.event, eps, f"{where}.event", selection_delta)
        return PrivacyCost(0) if count == 0 else Repeated(inner, count)
    if isinstance(event, _events.ComposedDpEvent):
        parts = [_from(part, eps, f"{where}.events[{i}]", selection_delta)
                 for i, part in enumerate(event.events)]
        if not parts:
            return PrivacyCost(0)
        if any(part != parts[0] for part in parts):
            raise UnsupportedChargeError(
                f"{where} is a ComposedDpEvent of different parts: one charge cannot hold "
                "it; charges_from_dp_event gives one charge per part")
        return parts[0] if len(parts) == 1 else Repeated(parts[0], len(parts))
    raise UnsupportedChargeError(
        f"{where} is a {kind}, a DpEvent dpaccount does not know: refused rather than "
        "approximated")


def _randomized_response(event: Any, where: str) -> Charge:
    """dp_accounting's RR keeps the input with probability 1 - p and otherwise answers
    uniformly over k buckets, so between two inputs the likelihood ratio is at most
    (1 - p + p/k) / (p/k) = 1 + k(1 - p)/p: pure ε = ln(1 + k(1-p)/p) (Kairouz, Oh and
    Viswanath 2016), a k-RR as `RandomizedResponseCharge` describes; ε is rounded up,
    which describes a k-RR of which this one is a post-processing."""
    k = _count(event.num_buckets, f"{where}.num_buckets", 2)
    p = _probability(event.noise_parameter, f"{where}.noise_parameter")
    if p == 0:
        raise UnsupportedChargeError(
            f"{where} is a RandomizedResponseDpEvent with noise_parameter 0: it answers "
            "the true bucket, with no finite privacy guarantee")
    ratio = 1 + k * (1 - p) / p
    return RandomizedResponseCharge(epsilon=Fraction(log_up(ratio)) if ratio > 1 else 0,
                                    categories=k)


def _noise(value: Any, field: str, kind: str) -> Fraction:
    exact = _number(value, field)
    if exact == 0:
        raise UnsupportedChargeError(
            f"{field} of the {kind} is 0: no noise, no finite privacy guarantee")
    if exact < 0:
        raise InvalidCostError(field, value, "must be > 0")
    return exact


def _probability(value: Any, field: str) -> Fraction:
    exact = _number(value, field)
    if not 0 <= exact <= 1:
        raise InvalidCostError(field, value, "must be in [0, 1]")
    return exact


def _number(value: Any, field: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise InvalidCostError(field, type(value).__name__, "must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidCostError(field, value, "must be finite")
    return Fraction(value)


def _decimal(value: Any, field: str) -> Fraction:
    """A probability given as a float, at its shortest decimal form (``repr``)."""
    exact = _number(value, field)
    return Fraction(repr(value)) if isinstance(value, float) else exact


def _exact_float(value: Fraction, kind: str) -> float:
    written = float(value)
    if Fraction(written) != value:
        raise UnsupportedChargeError(
            f"a {kind} whose parameters are not floats exactly has no DpEvent that is "
            "never more private than it; refused rather than rounded")
    return written


def _count(value: Any, field: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        shown = value if isinstance(value, int) else type(value).__name__
        raise InvalidCostError(field, shown, f"must be an integer >= {least}")
    return int(value)


def to_dp_event(charge: Charge) -> Any:
    """The dp_accounting ``DpEvent`` of a dpaccount charge, never more private than it.

    Floats are rounded toward more privacy loss: a noise multiplier down, a discrete
    Laplace parameter up, a Poisson sampling probability up, a randomized response's
    noise parameter down. A ``Subsampled`` without replacement keeps its exact rate as
    ``sample_size / source_dataset_size`` (the rate's numerator and denominator).

    Raises:
        UnsupportedChargeError: A charge with no ``DpEvent`` (an (ε, δ) cost other than
            zero, a ``Parallel``, a bounded-range or discrete Gaussian charge, a
            multidimensional discrete Laplace, a mixture of Gaussians or a
            repeat-and-select shape that is not a float exactly), named.

    Examples:
        >>> to_dp_event(Repeated(GaussianCharge(sigma=2, sensitivity=1, epsilon=1), 3))
        SelfComposedDpEvent(event=GaussianDpEvent(noise_multiplier=2.0), count=3)
    """
    kind = type(charge).__name__
    if isinstance(charge, PrivacyCost):
        if charge.epsilon == 0 and charge.delta == 0:
            return _events.NoOpDpEvent()
        raise UnsupportedChargeError(
            "a PrivacyCost other than zero has no DpEvent (dp_accounting composes "
            "mechanisms, not (epsilon, delta) pairs)")
    if isinstance(charge, GaussianCharge):
        return _events.GaussianDpEvent(float_down(charge.sigma / charge.sensitivity))
    if isinstance(charge, LaplaceCharge):
        return _events.LaplaceDpEvent(float_down(charge.scale / charge.sensitivity))
    if isinstance(charge, DiscreteLaplaceCharge):
        if charge.dimension != 1:
            raise UnsupportedChargeError(
                "a DiscreteLaplaceCharge of more than one dimension has no DpEvent")
        return _events.DiscreteLaplaceDpEvent(float_up(1 / charge.scale),
                                              int(charge.sensitivity))
    if isinstance(charge, RandomizedResponseCharge):
        k = charge.categories
        # p = k / (e^eps + k - 1) gives the ratio e^eps; e^eps rounded up and the
        # quotient rounded down give a p at most that, so a ratio at least e^eps
        p = float_down(Fraction(k) / (Fraction(exp_up(charge.epsilon)) + k - 1))
        return _events.RandomizedResponseDpEvent(p, k)
    if isinstance(charge, Subsampled):
        inner = to_dp_event(charge.charge)
        if charge.scheme == Scheme.POISSON:
            return _events.PoissonSampledDpEvent(float_up(charge.rate), inner)
        return _events.SampledWithoutReplacementDpEvent(
            charge.rate.denominator, charge.rate.numerator, inner)
    if isinstance(charge, Repeated):
        return _events.SelfComposedDpEvent(to_dp_event(charge.charge), charge.count)
    if isinstance(charge, MixtureOfGaussiansCharge):
        # which way a rounded mixing probability moves the loss depends on the others:
        # written out only when every number is a float exactly
        return _events.MixtureOfGaussiansDpEvent(
            _exact_float(charge.sigma, kind), [_exact_float(c, kind) for c in charge.sensitivities],
            [_exact_float(q, kind) for q in charge.probabilities])
    if isinstance(charge, RepeatAndSelect):
        inner = to_dp_event(charge.charge)
        mean = float_up(charge.mean)  # more runs on average: more loss
        if charge.shape is None:
            return _events.RepeatAndSelectDpEvent(inner, mean, math.inf)
        return _events.RepeatAndSelectDpEvent(inner, mean, _exact_float(charge.shape, kind))
    raise UnsupportedChargeError(f"a {kind} has no dp_accounting DpEvent")
