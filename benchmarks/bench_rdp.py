"""Renyi DP: dpaccount's declared-plan RDP rule against dp_accounting's RDP accountant.

Run (needs the bench extra: ``pip install -e ".[bench]"``)::

    python benchmarks/bench_rdp.py [--repeats 7]

For each workload both sides compose the same mechanism k times and convert to epsilon
at delta = 1e-5, in one run, alternating, each repeat from a cold cache (dpaccount's
per-charge RDP cache is cleared; dp_accounting keeps none). Imports happen before any
timer. Prints min and median milliseconds, epsilon, and the ratios dpaccount /
dp_accounting. Goal (issue 16): time ratio <= 1 at equal or smaller epsilon.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from dpaccount.accounting import rdp as ours_rdp
from dpaccount.accounting.rdp import charge_curves, subsampled
from dpaccount.charges import Charge, GaussianCharge, LaplaceCharge, Scheme, Subsampled

DELTA = 1e-5


def _clear() -> None:
    charge_curves._atom_vector.cache_clear()
    charge_curves._atom_floats.cache_clear()
    subsampled._sgm_log_a.cache_clear()
    subsampled._wor_log_a.cache_clear()
    subsampled._wor_even_differences.cache_clear()


def ours(charge: Charge, k: int, relation: str) -> Callable[[], float]:
    def run() -> float:
        rule = ours_rdp.RDPRule(DELTA, adaptive=False, plan=[(charge, k)], relation=relation)
        return float(rule.total(rule.add(rule.start(), charge, k)).epsilon)

    return run


def theirs(event: Any, k: int, replace_one: bool = False) -> Callable[[], float]:
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if replace_one
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)

    def run() -> float:
        acct = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
        acct.compose(event, k)
        return float(acct.get_epsilon(DELTA))

    return run


def workloads() -> list[tuple[str, Callable[[], float], Callable[[], float]]]:
    g = dp_accounting.GaussianDpEvent
    sgm = Subsampled(GaussianCharge(1.1, 1, 1), 256 / 60000, Scheme.POISSON)
    sgm2 = Subsampled(GaussianCharge(0.8, 1, 1), "0.01", Scheme.POISSON)
    wor = Subsampled(GaussianCharge(2.5, 1, 1), "0.01", Scheme.WITHOUT_REPLACEMENT)
    return [
        ("100 Gaussians, sigma 1", ours(GaussianCharge(1, 1, 1), 100, "add_remove"),
         theirs(g(1.0), 100)),
        ("10 Laplace, b 1", ours(LaplaceCharge(1, 1), 10, "add_remove"),
         theirs(dp_accounting.LaplaceDpEvent(1.0), 10)),
        ("DP-SGD q 256/60000 sigma 1.1 x 14063", ours(sgm, 14063, "add_remove"),
         theirs(dp_accounting.PoissonSampledDpEvent(256 / 60000, g(1.1)), 14063)),
        ("DP-SGD q 0.01 sigma 0.8 x 10000", ours(sgm2, 10000, "add_remove"),
         theirs(dp_accounting.PoissonSampledDpEvent(0.01, g(0.8)), 10000)),
        ("without replacement q 0.01 sigma 2.5 x 50", ours(wor, 50, "substitution"),
         theirs(dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, g(2.5)), 50,
                replace_one=True)),
    ]


def timed(fn: Callable[[], float], cold: Callable[[], None] | None) -> tuple[float, float]:
    if cold is not None:
        cold()
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"{'workload':44s} {'ours min/med ms':>17} {'dpa min/med ms':>17} "
          f"{'time ratio (min)':>17} {'eps ours':>9} {'eps dpa':>9}")
    for name, mine, other in workloads():
        ours_t, dpa_t = [], []
        eps_ours = eps_dpa = 0.0
        for _ in range(args.repeats):  # alternate the two sides
            t, eps_ours = timed(mine, _clear)
            ours_t.append(t)
            t, eps_dpa = timed(other, None)
            dpa_t.append(t)
        o_min, o_med = min(ours_t) * 1e3, statistics.median(ours_t) * 1e3
        d_min, d_med = min(dpa_t) * 1e3, statistics.median(dpa_t) * 1e3
        print(f"{name:44s} {o_min:8.2f}/{o_med:<8.2f} {d_min:8.2f}/{d_med:<8.2f} "
              f"{o_min / d_min:17.2f} {eps_ours:9.5f} {eps_dpa:9.5f}")


if __name__ == "__main__":
    main()
