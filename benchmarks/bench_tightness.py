"""Tightness: dpaccount's certified epsilon against every peer and the exact value, one run.

Run with the benchmark extra installed (``pip install -e ".[bench]"``)::

    python benchmarks/bench_tightness.py                # print the table
    python benchmarks/bench_tightness.py --write-docs   # and rewrite it in the docs

For each scenario (a mechanism and a composition, with a target delta) it computes, in
the same run, dpaccount's certified epsilon from the PLD engine and from the Renyi
engine ("dpaccount" is the smaller of the two, what the ``best`` rule keeps), the peers'
epsilons where they support the scenario (dp_accounting's PLD accountant on the same
grid, dp_accounting's RDP accountant, prv_accountant's upper bound, autodp's RDP), and
the exact value where one is known (closed forms, or an exact finite loss distribution
solved here). It prints the ratio of dpaccount's epsilon to the tightest peer's and to
the exact value. Goal: no ratio above 1.001 against any peer's upper bound. A peer that
does not support a scenario is "n/a"; an "inf" means the peer reports no finite epsilon.
"""

from __future__ import annotations

import argparse
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from scipy import optimize, special

from dpaccount.accounting.pld import compose_plan
from dpaccount.accounting.rdp import RDPRule
from dpaccount.charges import (
    BoundedRangeCharge,
    Charge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    RandomizedResponseCharge,
    Relation,
    RepeatAndSelect,
    Repeated,
    Scheme,
    Subsampled,
)
from dpaccount.costs import PrivacyCost

INTERVAL = 1e-4
DOCS = Path(__file__).resolve().parent.parent / "docs" / "tight-accounting.md"
START, END = "<!-- bench_tightness:start -->", "<!-- bench_tightness:end -->"

Value = Callable[[], float]


@dataclass
class Scenario:
    name: str
    delta: float
    plan: list[tuple[Charge, int]]
    relation: Relation = Relation.ADD_REMOVE
    peers: dict[str, Value] = field(default_factory=dict)
    exact: Value | None = None


# -- dpaccount -------------------------------------------------------------------------


def ours_pld(s: Scenario) -> float:
    charges = [Repeated(c, k) for c, k in s.plan]
    pld = compose_plan(charges, relation=s.relation, value_discretization_interval=INTERVAL,
                       lower=False)
    upper = pld.epsilon(s.delta)[1]
    return math.inf if upper is None else float(upper)


def ours_rdp(s: Scenario) -> float:
    rule = RDPRule(s.delta, adaptive=False, plan=s.plan, relation=s.relation)
    state = rule.start()
    for charge, k in s.plan:
        state = rule.add(state, charge, k)
    return float(rule.total(state).epsilon)


# -- peers -----------------------------------------------------------------------------


def dpa_pld(build: Callable[[Any], Any], delta: float) -> Value:
    """dp_accounting's PLD (connect-the-dots, pessimistic) on the same grid."""

    def run() -> float:
        from dp_accounting.pld import privacy_loss_distribution as pl

        return float(build(pl).get_epsilon_for_delta(delta))

    return run


def dpa_rdp(events: Callable[[Any], list[tuple[Any, int]]], delta: float,
            replace_one: bool = False) -> Value:
    def run() -> float:
        import dp_accounting
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if replace_one
                    else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        acct = rdp.RdpAccountant(neighboring_relation=relation)
        for event, k in events(dp_accounting):
            acct.compose(event, k)
        return float(acct.get_epsilon(delta))

    return run


def prv(build: Callable[[Any], list[tuple[Any, int]]], delta: float) -> Value:
    """prv_accountant's certified upper end."""

    def run() -> float:
        import prv_accountant.privacy_random_variables as rvs
        from prv_accountant import PRVAccountant

        parts = build(rvs)
        acct = PRVAccountant(prvs=[p for p, _ in parts],
                             max_self_compositions=[k for _, k in parts],
                             eps_error=1e-3, delta_error=delta * 1e-3)
        _low, _est, high = acct.compute_epsilon(delta=delta,
                                                num_self_compositions=[k for _, k in parts])
        return float(high)

    return run


def autodp(build: Callable[[Any], list[tuple[Any, int]]], delta: float) -> Value:
    def run() -> float:
        import autodp.mechanism_zoo as zoo
        from autodp.transformer_zoo import Composition

        parts = build(zoo)
        mech = Composition()([m for m, _ in parts], [k for _, k in parts])
        return float(mech.get_approxDP(delta))

    return run


# -- exact values ----------------------------------------------------------------------


def gdp_epsilon(mu: float, delta: float) -> float:
    """Gaussian DP: the epsilon with Phi(-e/mu + mu/2) - e^e Phi(-e/mu - mu/2) = delta
    (Dong, Roth and Su 2019, Cor. 2.13)."""

    def gap(eps: float) -> float:
        first = special.ndtr(-eps / mu + mu / 2)
        second = math.exp(eps + special.log_ndtr(-eps / mu - mu / 2))
        return float(first - second) - delta

    return float(optimize.brentq(gap, 0.0, 50 * mu + 50, xtol=1e-13))


def finite_epsilon(losses: dict[float, float], delta: float) -> float:
    """epsilon(delta) of a finite privacy loss distribution {loss: P-mass}."""
    items = sorted(losses.items())

    def gap(eps: float) -> float:
        return sum(m * -math.expm1(eps - x) for x, m in items if x > eps) - delta

    top = items[-1][0]
    if gap(0.0) <= 0:
        return 0.0
    return float(optimize.brentq(gap, 0.0, top, xtol=1e-13))


def composed(single: dict[float, float], k: int) -> dict[float, float]:
    out = {0.0: 1.0}
    for _ in range(k):
        nxt: dict[float, float] = {}
        for (a, pa), (b, pb) in product(out.items(), single.items()):
            key = round(a + b, 12)
            nxt[key] = nxt.get(key, 0.0) + pa * pb
        out = nxt
    return out


def pure_pair(eps: float) -> dict[float, float]:
    return {eps: 1 / (1 + math.exp(-eps)), -eps: 1 / (1 + math.exp(eps))}


def krr_pair(eps: float, k: int) -> dict[float, float]:
    p = 1 / (1 + (k - 1) * math.exp(-eps))
    q = math.exp(-eps) * p
    return {eps: p, 0.0: (k - 2) * q, -eps: q}


# -- the grid --------------------------------------------------------------------------


def scenarios() -> list[Scenario]:
    out: list[Scenario] = []

    def gauss(pl: Any, sigma: float, k: int, **kw: Any) -> Any:
        return pl.from_gaussian_mechanism(sigma, value_discretization_interval=INTERVAL,
                                          **kw).self_compose(k)

    for k in (10, 100):
        d = 1e-5
        out.append(Scenario(
            f"{k} Gaussians, σ = 1 (dpaccount: merged in closed form)", d,
            [(GaussianCharge(1, 1, 1), k)],
            peers={
                "dp_accounting PLD": dpa_pld(lambda pl, k=k: gauss(pl, 1.0, k), d),
                "dp_accounting RDP": dpa_rdp(lambda m, k=k: [(m.GaussianDpEvent(1.0), k)], d),
                "prv_accountant": prv(lambda r, k=k: [(r.GaussianMechanism(1.0), k)], d),
                "autodp": autodp(lambda z, k=k: [(z.GaussianMechanism(1.0), k)], d),
            },
            exact=lambda k=k, d=d: gdp_epsilon(math.sqrt(k), d),
        ))
    d = 1e-5
    out.append(Scenario(
        "10 Laplace, b = 1", d, [(LaplaceCharge(1, 1), 10)],
        peers={
            "dp_accounting PLD": dpa_pld(lambda pl: pl.from_laplace_mechanism(
                1.0, value_discretization_interval=INTERVAL).self_compose(10), d),
            "dp_accounting RDP": dpa_rdp(lambda m: [(m.LaplaceDpEvent(1.0), 10)], d),
            "prv_accountant": prv(lambda r: [(r.LaplaceMechanism(1.0), 10)], d),
            "autodp": autodp(lambda z: [(z.LaplaceMechanism(b=1.0), 10)], d),
        },
    ))
    out.append(Scenario(
        "4 Laplace, b = 1, at δ = 0", 0.0, [(LaplaceCharge(1, 1), 4)],
        peers={"dp_accounting PLD": dpa_pld(lambda pl: pl.from_laplace_mechanism(
            1.0, value_discretization_interval=INTERVAL).self_compose(4), 0.0)},
        exact=lambda: 4.0,
    ))
    out.append(Scenario(
        "(1, 0) + (2, 0) at δ = 0", 0.0, [(PrivacyCost(1), 1), (PrivacyCost(2), 1)],
        peers={"dp_accounting PLD": dpa_pld(lambda pl: _dpa_pairs(pl, [(1, 0), (2, 0)]), 0.0)},
        exact=lambda: 3.0,
    ))
    out.append(Scenario(
        "(1, 0.1) + (2, 0.2) at δ = 0.28", 0.28,
        [(PrivacyCost(1, 0.1), 1), (PrivacyCost(2, 0.2), 1)],
        peers={"dp_accounting PLD": dpa_pld(
            lambda pl: _dpa_pairs(pl, [(1, 0.1), (2, 0.2)]), 0.28)},
        exact=lambda: 3.0,
    ))
    d = 1e-6
    out.append(Scenario(
        "100 pure ε = 0.1 (optimal composition)", d, [(PrivacyCost("0.1"), 100)],
        peers={
            "dp_accounting PLD": dpa_pld(lambda pl: _dpa_pairs(pl, [(0.1, 0)] * 100), d),
            "prv_accountant": prv(lambda r: [(r.PureDPMechanism(0.1), 100)], d),
            "autodp": autodp(lambda z: [(z.PureDP_Mechanism(0.1), 100)], d),
        },
        exact=lambda: finite_epsilon(composed(pure_pair(0.1), 100), 1e-6),
    ))
    d = 1e-5
    out.append(Scenario(
        "10 discrete Laplace, b = 1, S = 1", d, [(DiscreteLaplaceCharge(1, 1), 10)],
        peers={
            "dp_accounting PLD": dpa_pld(lambda pl: pl.from_discrete_laplace_mechanism(
                1.0, value_discretization_interval=INTERVAL).self_compose(10), d),
        },
        exact=lambda: finite_epsilon(composed(_dlap_pair(1.0), 10), 1e-5),
    ))
    out.append(Scenario(
        "10 discrete Gaussians, σ = 2, S = 1", d,
        [(DiscreteGaussianCharge(2, 1, 1, "0.5"), 10)],
        peers={
            "dp_accounting PLD": dpa_pld(lambda pl: pl.from_discrete_gaussian_mechanism(
                2.0, value_discretization_interval=INTERVAL).self_compose(10), d),
        },
    ))
    q = 0.1
    out.append(Scenario(
        "50 Poisson-subsampled Laplace, q = 0.1, b = 1", d,
        [(Subsampled(LaplaceCharge(1, 1), "0.1", Scheme.POISSON), 50)],
        peers={"dp_accounting PLD": dpa_pld(lambda pl: pl.from_laplace_mechanism(
            1.0, sampling_prob=0.1, value_discretization_interval=INTERVAL).self_compose(50),
            d)},
    ))
    out.append(Scenario(
        "the same at δ = 0", 0.0,
        [(Subsampled(LaplaceCharge(1, 1), "0.1", Scheme.POISSON), 50)],
        peers={"dp_accounting PLD": dpa_pld(lambda pl: pl.from_laplace_mechanism(
            1.0, sampling_prob=0.1, value_discretization_interval=INTERVAL).self_compose(50),
            0.0)},
        exact=lambda: 50 * math.log1p(q * math.expm1(1.0)),
    ))
    # The last two (issue 27, item 6): far more steps, and a far smaller delta, where the
    # ratio to the tightest peer was measured above the 1.00001 of the rows before them.
    for rate, sigma, steps, dd in ((256 / 60000, 1.1, 14063, d), (0.01, 1.0, 1000, d),
                                   (256 / 60000, 1.1, 10**6, d),
                                   (256 / 60000, 1.1, 14063, 1e-8)):
        out.append(Scenario(
            f"DP-SGD q = {rate:.4g}, σ = {sigma}, {steps} steps", dd,
            [(Subsampled(GaussianCharge(sigma, 1, 1), rate, Scheme.POISSON), steps)],
            peers={
                "dp_accounting PLD": dpa_pld(lambda pl, r=rate, s=sigma, t=steps: gauss(
                    pl, s, t, sampling_prob=r), dd),
                "dp_accounting RDP": dpa_rdp(lambda m, r=rate, s=sigma, t=steps: [
                    (m.PoissonSampledDpEvent(r, m.GaussianDpEvent(s)), t)], dd),
                "prv_accountant": prv(lambda rv, r=rate, s=sigma, t=steps: [
                    (rv.PoissonSubsampledGaussianMechanism(r, s), t)], dd),
            },
        ))
    out.append(Scenario(
        "without replacement q = 0.01, σ = 2.5, 50 steps", d,
        [(Subsampled(GaussianCharge(2.5, 1, 1), "0.01", Scheme.WITHOUT_REPLACEMENT), 50)],
        relation=Relation.SUBSTITUTION,
        peers={"dp_accounting RDP": dpa_rdp(lambda m: [(m.SampledWithoutReplacementDpEvent(
            1000, 10, m.GaussianDpEvent(2.5)), 50)], d, replace_one=True)},
    ))
    d = 1e-6
    eps17 = math.log(17)
    out.append(Scenario(
        "10 reports of 4-ary RR, e^ε = 17", d, [(RandomizedResponseCharge(eps17, 4), 10)],
        peers={
            "dp_accounting PLD": dpa_pld(lambda pl: pl.from_randomized_response(
                0.2, 4, value_discretization_interval=INTERVAL).self_compose(10), d),
            "dp_accounting RDP": dpa_rdp(lambda m: [(m.RandomizedResponseDpEvent(0.2, 4), 10)],
                                         d),
        },
        exact=lambda: finite_epsilon(composed(krr_pair(eps17, 4), 10), 1e-6),
    ))
    out.append(Scenario(
        "20 exponential mechanisms, ε = 0.5", d, [(BoundedRangeCharge("0.5"), 20)],
        peers={
            "dp_accounting PLD (as ε-DP)": dpa_pld(
                lambda pl: _dpa_pairs(pl, [(0.5, 0)] * 20), d),
            "prv_accountant (as ε-DP)": prv(lambda r: [(r.PureDPMechanism(0.5), 20)], d),
            "autodp ExponentialMechanism": autodp(
                lambda z: [(z.ExponentialMechanism(0.5), 20)], d),
        },
    ))
    out.extend(_selection_scenarios())
    mog = MixtureOfGaussiansCharge(1, [0, 1], ["0.9", "0.1"], epsilon=10)
    out.append(Scenario(
        "mixture of Gaussians σ = 1, shifts {0, 1} w.p. {0.9, 0.1}", 1e-6, [(mog, 1)],
        peers={"dp_accounting PLD": dpa_pld(lambda pl: pl.from_mixture_gaussian_mechanism(
            1.0, [0.0, 1.0], [0.9, 0.1], value_discretization_interval=INTERVAL), 1e-6)},
    ))
    return out


def _selection_scenarios() -> list[Scenario]:
    """Repeat-and-select (Papernot and Steinke 2022): dp_accounting's RDP accountant on
    RepeatAndSelectDpEvent (shape inf is Poisson, 1 geometric, 0 logarithmic)."""
    d, out = 1e-6, []
    sgd = Repeated(Subsampled(GaussianCharge(1, 1, 30), "0.01", Scheme.POISSON), 1000)
    cases: list[tuple[str, Charge, float | None, Callable[[Any], Any]]] = [
        ("σ = 3", GaussianCharge(3, 1, 30), None, lambda m: m.GaussianDpEvent(3)),
        ("σ = 3", GaussianCharge(3, 1, 30), 1.0, lambda m: m.GaussianDpEvent(3)),
        ("σ = 3", GaussianCharge(3, 1, 30), 0.0, lambda m: m.GaussianDpEvent(3)),
        ("DP-SGD q = 0.01, σ = 1, 1000 steps", sgd, 1.0, lambda m: m.SelfComposedDpEvent(
            m.PoissonSampledDpEvent(0.01, m.GaussianDpEvent(1)), 1000)),
        ("DP-SGD q = 0.01, σ = 1, 1000 steps", sgd, None, lambda m: m.SelfComposedDpEvent(
            m.PoissonSampledDpEvent(0.01, m.GaussianDpEvent(1)), 1000)),
    ]
    for what, run, shape, event in cases:
        count = {None: "Poisson", 1.0: "geometric", 0.0: "logarithmic"}[shape]
        kw: dict[str, Any] = ({"distribution": "poisson"} if shape is None else
                              {"distribution": "truncated_negative_binomial", "shape": shape})
        charge = RepeatAndSelect(run, mean=10, delta="0.1", **kw)
        dpa_shape = math.inf if shape is None else shape
        out.append(Scenario(
            f"best of {count}(10) runs, {what}", d, [(charge, 1)],
            peers={"dp_accounting RDP": dpa_rdp(
                lambda m, e=event, sh=dpa_shape: [
                    (m.dp_event.RepeatAndSelectDpEvent(e(m.dp_event), 10, sh), 1)], d)},
        ))
    return out


def _dpa_pairs(pl: Any, pairs: list[tuple[float, float]]) -> Any:
    from dp_accounting.pld import common

    result = None
    for eps, delta in pairs:
        one = pl.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, delta),
                                         value_discretization_interval=INTERVAL)
        result = one if result is None else result.compose(one)
    return result


def _dlap_pair(b: float) -> dict[float, float]:
    """Discrete Laplace, shift 1: loss +1/b for y >= 1, -1/b for y <= 0 (masses under P)."""
    q = math.exp(-1 / b)
    above = 1 / (1 + q)  # P[Y + 1 >= 1] = P[Y >= 0]
    return {1 / b: above, -1 / b: 1 - above}


# -- running ---------------------------------------------------------------------------


def attempt(fn: Value | None) -> float | str:
    if fn is None:
        return "n/a"
    try:
        return fn()
    except Exception as exc:  # a peer that cannot run this scenario
        return f"error: {type(exc).__name__}"


def show(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return "inf" if math.isinf(value) else f"{value:.6g}"


def run(only: str | None = None) -> tuple[list[list[str]], float]:
    rows: list[list[str]] = []
    worst = 0.0
    for s in scenarios():
        if only is not None and only not in f"{s.name} (δ = {s.delta:g})":
            continue
        pld, rdp = attempt(lambda s=s: ours_pld(s)), attempt(lambda s=s: ours_rdp(s))
        if isinstance(rdp, str):
            rdp = "n/a"  # no Renyi bound at delta = 0, or for a charge with delta > 0
        mine = min(v for v in (pld, rdp, math.inf) if isinstance(v, float))
        peers = {name: attempt(fn) for name, fn in s.peers.items()}
        finite = {n: v for n, v in peers.items() if isinstance(v, float) and math.isfinite(v)}
        exact = attempt(s.exact) if s.exact is not None else "n/a"
        tightest = min(finite.items(), key=lambda kv: kv[1]) if finite else None
        if tightest is None:
            vs_peer = "n/a" if not peers else "peers: none finite"
        elif tightest[1] == 0:
            vs_peer = "1" if mine == 0 else "inf"
        else:
            r = mine / tightest[1]
            worst = max(worst, r)
            vs_peer = f"{r:.5f}"
        vs_exact = (f"{mine / exact:.5f}" if isinstance(exact, float) and exact > 0
                    else ("1" if exact == 0.0 and mine == 0 else "n/a"))
        peer_text = "; ".join(f"{n} {show(v)}" for n, v in peers.items()) or "none"
        rows.append([s.name, f"{s.delta:g}", show(pld), show(rdp), show(mine), peer_text,
                     f"{tightest[0]}" if tightest else "—", vs_peer, show(exact), vs_exact])
        print(f"== {s.name} (δ = {s.delta:g})")
        print(f"   dpaccount PLD {show(pld)}  RDP {show(rdp)}  -> {show(mine)}")
        for name, value in peers.items():
            print(f"   {name:32s} {show(value)}")
        print(f"   exact {show(exact)};  ratio to tightest peer {vs_peer}, to exact {vs_exact}")
    return rows, worst


HEADER = ["scenario", "δ", "dpaccount PLD", "dpaccount RDP", "dpaccount", "peers",
          "tightest peer", "dpaccount / tightest peer", "exact", "dpaccount / exact"]


def markdown(rows: list[list[str]], worst: float) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    lines.append(f"Largest ratio to the tightest peer: {worst:.5f} (goal: at most 1.001).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-docs", action="store_true",
                        help=f"rewrite the table between the markers in {DOCS.name}")
    parser.add_argument("--only", metavar="TEXT",
                        help="only the scenarios whose name (with its δ) contains TEXT")
    args = parser.parse_args()
    if args.only and args.write_docs:
        parser.error("--write-docs needs every scenario")
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # the peers' numerics
    rows, worst = run(args.only)
    table = markdown(rows, worst)
    print()
    print(table)
    if args.write_docs:
        text = DOCS.read_text(encoding="utf-8")
        block = f"{START}\n{table}\n{END}"
        text, n = re.subn(re.escape(START) + ".*?" + re.escape(END), lambda _m: block, text,
                          flags=re.S)
        if n != 1:
            raise SystemExit(f"markers {START} ... {END} not found in {DOCS}")
        DOCS.write_text(text, encoding="utf-8")
        print(f"\nwrote the table into {DOCS}")


if __name__ == "__main__":
    main()
