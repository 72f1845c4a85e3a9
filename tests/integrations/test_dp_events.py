"""dp_accounting ``DpEvent`` trees in and out (issue 31, item 2).

Skipped without dp_accounting (``pip install "dpaccount[dp-accounting]"``);
``DPACCOUNT_REQUIRE_ML=1`` (set by ``.ci/run``) turns the skip into a failure.

The independent check is dp_accounting itself: the same event composed by its PLD (and,
for sampling without replacement, its RDP) accountant gives the epsilon that dpaccount's
engines give for the translated charges, within the engines' discretisation.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

if os.environ.get("DPACCOUNT_REQUIRE_ML") != "1":
    pytest.importorskip("dp_accounting", reason='pip install "dpaccount[dp-accounting]"')

from dp_accounting import dp_event as ev
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpaccount import Accountant, Budget, PrivacyCost
from dpaccount.accounting.pld import compose_plan
from dpaccount.accounting.rdp import charge_rdp, rdp_epsilon
from dpaccount.charges import (
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    RepeatAndSelect,
    Repeated,
    Scheme,
    Subsampled,
    atoms,
)
from dpaccount.errors import InvalidCostError, UnsupportedChargeError
from dpaccount.integrations.dp_events import (
    charges_from_dp_event,
    from_dp_event,
    to_dp_event,
)

NeighborRel = pld_privacy_accountant.NeighborRel


def test_each_event_becomes_the_charge_the_table_names() -> None:
    assert from_dp_event(ev.NoOpDpEvent()) == PrivacyCost(0)
    assert from_dp_event(ev.GaussianDpEvent(1.5), gaussian_epsilon=2) == GaussianCharge(
        sigma="1.5", sensitivity=1, epsilon=2)
    assert from_dp_event(ev.LaplaceDpEvent(0.25)) == LaplaceCharge(scale="0.25", sensitivity=1)
    assert from_dp_event(ev.DiscreteLaplaceDpEvent(0.5, 3)) == DiscreteLaplaceCharge(
        scale=2, sensitivity=3)
    sampled = from_dp_event(ev.PoissonSampledDpEvent(0.125, ev.GaussianDpEvent(1.0)))
    assert sampled == Subsampled(GaussianCharge(1, 1, 1), "0.125", Scheme.POISSON)
    wor = from_dp_event(ev.SampledWithoutReplacementDpEvent(1000, 10, ev.LaplaceDpEvent(1.0)))
    assert wor == Subsampled(LaplaceCharge(1, 1), Fraction(1, 100), Scheme.WITHOUT_REPLACEMENT)
    assert from_dp_event(ev.SelfComposedDpEvent(ev.LaplaceDpEvent(2.0), 7)) == Repeated(
        LaplaceCharge(2, 1), 7)
    same = ev.ComposedDpEvent([ev.LaplaceDpEvent(2.0)] * 3)
    assert from_dp_event(same) == Repeated(LaplaceCharge(2, 1), 3)
    # zero counts and zero probabilities are no-ops
    assert from_dp_event(ev.SelfComposedDpEvent(ev.LaplaceDpEvent(2.0), 0)) == PrivacyCost(0)
    assert from_dp_event(ev.PoissonSampledDpEvent(0.0, ev.LaplaceDpEvent(2.0))) == PrivacyCost(0)


def test_randomized_response_is_described_by_its_exact_ratio_rounded_up() -> None:
    # keep with 1 - p, else uniform over k: ratio 1 + k (1 - p) / p = 1 + 4 * 0.75 / 0.25
    charge = from_dp_event(ev.RandomizedResponseDpEvent(0.25, 4))
    assert isinstance(charge, RandomizedResponseCharge) and charge.categories == 4
    assert math.log(13) <= charge.epsilon <= math.log(13) * (1 + 1e-12)
    assert from_dp_event(ev.RandomizedResponseDpEvent(1.0, 3)).epsilon == 0


def test_a_composition_of_different_parts_is_one_charge_per_part() -> None:
    event = ev.ComposedDpEvent([ev.LaplaceDpEvent(2.0),
                                ev.ComposedDpEvent([ev.GaussianDpEvent(3.0),
                                                    ev.NoOpDpEvent()])])
    assert charges_from_dp_event(event) == [LaplaceCharge(2, 1), GaussianCharge(3, 1, 1),
                                            PrivacyCost(0)]
    with pytest.raises(UnsupportedChargeError, match="charges_from_dp_event"):
        from_dp_event(event)


@pytest.mark.parametrize("event", [
    ev.NonPrivateDpEvent(), ev.UnsupportedDpEvent(),
    ev.SampledWithReplacementDpEvent(100, 10, ev.GaussianDpEvent(1.0)),
    ev.TruncatedSubsampledGaussianDpEvent(1000, 0.01, 20, 1.0),
    ev.SingleEpochTreeAggregationDpEvent(1.0, 8),
    ev.ZCDpEvent(0.5, 0.0),
    ev.GaussianDpEvent(0.0),  # no noise
    ev.RandomizedResponseDpEvent(0.0, 2),  # always the truth
])
def test_what_cannot_be_expressed_is_refused_by_name_and_nothing_is_charged(
        event: ev.DpEvent) -> None:
    acct = Accountant(Budget(100, "1e-5"))
    nested = ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(0.5, event), 3)
    for tree in (event, nested):
        with pytest.raises(UnsupportedChargeError, match=type(event).__name__) as info:
            acct.charge(from_dp_event(tree))
        if tree is nested:
            assert "event.event" in str(info.value)  # where in the tree
    assert len(acct.records) == 0 and acct.spent == PrivacyCost(0)


@pytest.mark.parametrize(("event", "field"), [
    (ev.GaussianDpEvent(-1.0), "noise_multiplier"),
    (ev.LaplaceDpEvent(float("nan")), "noise_multiplier"),
    (ev.LaplaceDpEvent(float("inf")), "noise_multiplier"),
    (ev.GaussianDpEvent(True), "noise_multiplier"),
    (ev.PoissonSampledDpEvent(1.5, ev.LaplaceDpEvent(1.0)), "sampling_probability"),
    (ev.SampledWithoutReplacementDpEvent(10, 11, ev.LaplaceDpEvent(1.0)), "sample_size"),
    (ev.SelfComposedDpEvent(ev.LaplaceDpEvent(1.0), -1), "count"),
    (ev.SelfComposedDpEvent(ev.LaplaceDpEvent(1.0), 2.5), "count"),
    (ev.RandomizedResponseDpEvent(0.5, 1), "num_buckets"),
    (ev.DiscreteLaplaceDpEvent(0.5, 0), "sensitivity"),
])
def test_bad_parameters_are_typed_errors_naming_the_field(event: ev.DpEvent, field: str
                                                          ) -> None:
    with pytest.raises(InvalidCostError, match=field):
        from_dp_event(event)


def test_anything_else_is_refused() -> None:
    with pytest.raises(UnsupportedChargeError, match="not a dp_accounting DpEvent"):
        from_dp_event(PrivacyCost(1))  # type: ignore[arg-type]


# -- the same epsilon as dp_accounting ------------------------------------------------------


@pytest.mark.parametrize("event", [
    ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(1.0)), 1000),
    ev.SelfComposedDpEvent(ev.LaplaceDpEvent(4.0), 20),
    ev.ComposedDpEvent([ev.GaussianDpEvent(2.0), ev.LaplaceDpEvent(3.0),
                        ev.SelfComposedDpEvent(ev.DiscreteLaplaceDpEvent(0.5, 1), 5)]),
    ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(0.05, ev.LaplaceDpEvent(1.0)), 200),
])
def test_the_pld_epsilon_matches_dp_accountings(event: ev.DpEvent) -> None:
    delta = 1e-6
    theirs = pld_privacy_accountant.PLDAccountant(
        NeighborRel.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4
    ).compose(event).get_epsilon(delta)
    low, high = compose_plan(charges_from_dp_event(event),
                             value_discretization_interval=1e-4).epsilon(delta)
    assert float(low) <= float(high)
    assert abs(float(high) / theirs - 1) < 0.01, (float(high), theirs)


def _rdp_epsilon(charges: list, delta: float, relation: Relation) -> float:
    """dpaccount's RDP curve of the charges (`charge_rdp`, per atom) at dp_accounting's
    orders, converted as dpaccount converts (`rdp_epsilon`)."""
    orders = list(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
    curve = [sum(charge_rdp(atom, alpha, relation=relation) * count
                 for charge in charges for atom, count in atoms(charge))
             for alpha in orders]
    return rdp_epsilon(curve, orders, delta)[0]


def test_sampling_without_replacement_matches_dp_accountings_rdp() -> None:
    event = ev.SelfComposedDpEvent(
        ev.SampledWithoutReplacementDpEvent(10_000, 100, ev.GaussianDpEvent(1.5)), 500)
    theirs = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=NeighborRel.REPLACE_ONE).compose(event).get_epsilon(1e-6)
    ours = _rdp_epsilon(charges_from_dp_event(event), 1e-6, Relation.SUBSTITUTION)
    assert abs(ours / theirs - 1) < 0.01, (ours, theirs)


def test_a_charged_event_is_what_the_ledger_records() -> None:
    # A TF-Privacy-style DP-SGD event, charged to a ledger under the Renyi filter.
    epoch = ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(1 / 32, ev.GaussianDpEvent(1.0)),
                                   100)
    acct = Accountant(Budget(8, "1e-5"), rule="rdp")
    record = acct.charge(from_dp_event(epoch), label="epoch 1-3")
    assert record.charge == from_dp_event(epoch)
    theirs = rdp_privacy_accountant.RdpAccountant().compose(epoch).get_epsilon(1e-5)
    assert abs(_rdp_epsilon([record.charge], 1e-5, Relation.ADD_REMOVE) / theirs - 1) < 0.01
    assert float(acct.spent.epsilon) >= theirs  # what the filter reports is never below


# -- back to DpEvents -----------------------------------------------------------------------


FLOATS = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
PROBS = st.floats(min_value=1e-6, max_value=1.0, allow_nan=False)


@st.composite
def events(draw: st.DrawFn, depth: int = 0) -> ev.DpEvent:
    leaves = [st.builds(ev.GaussianDpEvent, FLOATS), st.builds(ev.LaplaceDpEvent, FLOATS),
              st.builds(ev.DiscreteLaplaceDpEvent, FLOATS, st.integers(1, 5))]
    if depth >= 2:
        return draw(st.one_of(leaves))
    inner = events(depth + 1)
    return draw(st.one_of(
        *leaves,
        st.builds(ev.PoissonSampledDpEvent, PROBS, inner),
        st.builds(lambda m, extra, e: ev.SampledWithoutReplacementDpEvent(m + extra, m, e),
                  st.integers(1, 1000), st.integers(0, 10**6), inner),
        st.builds(ev.SelfComposedDpEvent, inner, st.integers(1, 1000)),
    ))


@given(events())
def test_events_make_a_round_trip_unchanged(event: ev.DpEvent) -> None:
    # floats are taken exactly and written back exactly; a sample without replacement
    # comes back as the same rate in lowest terms
    back = to_dp_event(from_dp_event(event))
    assert from_dp_event(back) == from_dp_event(event)


@given(st.fractions(min_value=Fraction(1, 10**4), max_value=10**4),
       st.fractions(min_value=Fraction(1, 10**4), max_value=10**4))
def test_a_noise_multiplier_written_out_is_never_larger_than_the_charges(
        sigma: Fraction, sensitivity: Fraction) -> None:
    for charge in (GaussianCharge(sigma, sensitivity, 1), LaplaceCharge(sigma, sensitivity)):
        assert Fraction(to_dp_event(charge).noise_multiplier) <= sigma / sensitivity


@given(st.fractions(min_value=Fraction(1, 10**6), max_value=1))
def test_a_poisson_rate_written_out_is_never_smaller(rate: Fraction) -> None:
    event = to_dp_event(Subsampled(LaplaceCharge(1, 1), rate, Scheme.POISSON))
    assert Fraction(event.sampling_probability) >= rate


@given(st.fractions(min_value=0, max_value=20), st.integers(2, 50))
def test_randomized_response_written_out_is_never_more_private(epsilon: Fraction, k: int
                                                              ) -> None:
    event = to_dp_event(RandomizedResponseCharge(epsilon, k))
    p = Fraction(event.noise_parameter)
    assert 0 < p <= 1
    assert 1 + k * (1 - p) / p >= Fraction(math.exp(float(epsilon))) * (1 - Fraction(1, 10**12))
    assert from_dp_event(event).epsilon >= epsilon


@pytest.mark.parametrize("charge", [
    PrivacyCost(1), PrivacyCost(0, "1e-6"),
    Parallel([LaplaceCharge(1, 1), LaplaceCharge(2, 1)]),
    DiscreteLaplaceCharge(2, 1, dimension=3),
])
def test_charges_without_an_event_are_refused_by_name(charge: object) -> None:
    with pytest.raises(UnsupportedChargeError, match=type(charge).__name__.replace(
            "PrivacyCost", "PrivacyCost other than zero")):
        to_dp_event(charge)  # type: ignore[arg-type]


def test_repeat_and_select_and_mixtures_become_their_charges() -> None:
    gaussian = GaussianCharge(3, 1, 3)  # each run reported at epsilon 3: its delta is tiny
    poisson = from_dp_event(ev.RepeatAndSelectDpEvent(ev.GaussianDpEvent(3.0), 10.0,
                                                      math.inf),
                            gaussian_epsilon=3, selection_delta="1e-6")
    assert poisson == RepeatAndSelect(gaussian, 10, "poisson", delta="1e-6")
    geometric = from_dp_event(ev.RepeatAndSelectDpEvent(ev.LaplaceDpEvent(2.0), 10.0, 1.0))
    assert geometric == RepeatAndSelect(LaplaceCharge(2, 1), 10,
                                        "truncated_negative_binomial", 1)
    assert geometric.cost == PrivacyCost("1.5")  # (2 + eta) epsilon for a pure run
    for charge in (poisson, geometric):
        assert from_dp_event(to_dp_event(charge), gaussian_epsilon=3,
                             selection_delta=charge.delta) == charge
    # the probabilities at their decimal form: 0.9 + 0.1 is exactly 1 there
    mixture = from_dp_event(ev.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0], [0.9, 0.1]))
    assert mixture == MixtureOfGaussiansCharge(1, [0, 1], ["0.9", "0.1"], 1)
    with pytest.raises(UnsupportedChargeError, match="not floats exactly"):
        to_dp_event(mixture)  # 0.9 is no float exactly: refused rather than rounded
    halves = MixtureOfGaussiansCharge(1, [0, 1], ["0.5", "0.5"], 1)
    assert from_dp_event(to_dp_event(halves)) == halves


def test_a_mixture_of_gaussians_has_dp_accountings_pld_epsilon() -> None:
    # issue 31: dp_accounting's PLD gives 2.182 for sigma 1, shifts {0, 1} w.p. {0.9, 0.1}
    event = ev.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0], [0.9, 0.1])
    theirs = pld_privacy_accountant.PLDAccountant(
        NeighborRel.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4
    ).compose(event).get_epsilon(1e-6)
    low, high = compose_plan([from_dp_event(event)],
                             value_discretization_interval=1e-4).epsilon(1e-6)
    assert float(low) <= float(high)
    assert abs(float(high) / theirs - 1) < 0.01, (float(high), theirs)
