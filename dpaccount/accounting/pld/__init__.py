"""Privacy loss distributions (PLD): tight (epsilon, delta) for declared plans.

The engine represents a mechanism by the distribution of its privacy loss on a grid of
spacing ``value_discretization_interval`` and composes by FFT convolution (Koskela,
Jalko and Honkela 2020, "Computing tight differential privacy guarantees using FFT",
AISTATS; Koskela, Jalko, Prediger and Honkela 2021, AISTATS). Every result is an interval
(lower, upper):

* the upper end comes from a *pessimistic* discretisation, the "connect the dots"
  construction of Doroshenko, Ghazi, Kamath, Kumar and Manurangsi 2022 ("Connect the
  dots: tighter discrete approximations of privacy loss distributions", PETS): its
  privacy profile dominates the mechanism's, so the composed value is a certified
  upper bound (tails truncated with the truncated mass added to delta; floating-point
  error of every FFT bounded and added to delta);
* the lower end comes from an *optimistic* discretisation: the output is binned by its
  loss (post-processing) and each bin's loss rounded down to the grid (Meiser and
  Mohammadi 2018, "Tight on budget?", CCS, round down without binning).

Self-composition raises one FFT to the k-th power on a window chosen by a Chernoff
bound (the mass outside is bounded and added to delta); heterogeneous composition
convolves in sequence.

Mechanisms: Gaussian (sigma, sensitivity), Laplace (scale, sensitivity), any
(epsilon, delta) guarantee through its dominating pair (Kairouz, Oh and Viswanath 2015,
Thm 2.4: the randomized response pair; composing those gives the optimal composition of
the declared plan), Poisson-subsampled Gaussian and Laplace under add/remove (both the
remove and the add direction are composed; the result is the larger of the two: the
direction is the same at every step, Zhu, Dong and Wang 2022, "Optimal accounting of
differential privacy via characteristic function", AISTATS), and
without-replacement-subsampled Gaussian and Laplace under substitution. For the latter the
analyst may choose at every step which of the two orders the differing records take, so
each step uses one pair whose profile is the maximum of both orders' profiles
(`SymmetrisedPair`; Lebeda, Regehr, Kamath and
Steinke 2024, arXiv:2405.20769, on why composing each order on its own is unsound there;
ZDW 2022, Thm 10, for the adaptive composition of dominating pairs). Gaussians
without subsampling are composed exactly first: k Gaussians of noise multipliers s_i
are one Gaussian of mu = sqrt(sum 1/s_i^2) (Dong, Roth and Su 2019, Cor. 3.3).

Adaptivity: the PLD composition theorem holds for mechanisms chosen adaptively as long
as the *sequence of dominating pairs* (mechanism kinds and parameters) is fixed in
advance (composition of dominating pairs, Zhu, Dong and Wang 2022; Dong, Roth and Su 2019,
Thm 3.2): ``ADAPTIVE_MECHANISMS``. Parameters chosen at run time are *not* covered: the
natural "stop when the composed PLD crosses the budget" filter is not valid in general,
so `PLDRule` only takes a declared plan.


The package, one concept a module:

* `pairs`, `subsampled`, `lattice`: the dominating pairs, by family (plain mechanisms;
  subsampled ones and the pair dominating both orders; integer shifts of lattice noise);
* `discrete`: a PLD discretised on a grid, composed by FFT, and its discretisation from
  a pair (pessimistic and optimistic);
* `directions`: what a distribution holds (four discretisations, certified loss facts);
* `build`: building one from a mechanism (its pairs and loss facts);
* `distribution`: `PrivacyLossDistribution`, the type users compose and read;
* `rule`: a declared plan, `compose_plan()` and `PLDRule`.

Examples:
    >>> pld = PrivacyLossDistribution.gaussian(sigma=1, value_discretization_interval=1e-3)
    >>> low, high = pld.epsilon(1e-5)
    >>> 4.36 < float(low) <= float(high) < 4.39   # exact (Balle-Wang) 4.3772 at mu = 1
    True
"""

from dpaccount.accounting.pld.build import DEFAULT_INTERVAL as DEFAULT_INTERVAL
from dpaccount.accounting.pld.build import DEFAULT_TAIL_MASS as DEFAULT_TAIL_MASS
from dpaccount.accounting.pld.distribution import PrivacyLossDistribution
from dpaccount.accounting.pld.rule import PLDRule, compose_plan
from dpaccount.accounting.pld.rule import PLDState as PLDState
from dpaccount.accounting.pld.rule import plan_runs as plan_runs

__all__ = ["PLDRule", "PrivacyLossDistribution", "compose_plan"]
