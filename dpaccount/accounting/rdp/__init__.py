"""Renyi differential privacy (RDP), zCDP, and the Renyi and Gaussian-DP filters.

RDP of order alpha bounds the Renyi divergence D_alpha(M(D) || M(D')) (Mironov 2017,
"Renyi differential privacy", CSF, Def. 4). RDP values add up under composition
(Mironov 2017, Prop. 1), also for adaptively chosen mechanisms; with the Renyi filter
(Feldman and Zrnic 2021, "Individual privacy accounting via a Renyi filter", NeurIPS,
Thm 3.1) they add up even when each mechanism's parameters are chosen at run time, as
long as the running sum stays within a budget fixed in advance.

Values computed here (all in nats, all rounded up by a relative margin):

* Gaussian: alpha * Delta^2 / (2 sigma^2) (Mironov 2017, Prop. 7); the same for the
  discrete Gaussian of our own mechanisms (Canonne, Kamath and Steinke 2020, Prop. 5);
* Laplace: Mironov 2017, Prop. 6;
* Poisson-subsampled Gaussian, add/remove: Mironov, Talwar and Zhang 2019 ("Renyi
  differential privacy of the sampled Gaussian mechanism"), Sec. 3.3: the exact
  A_alpha = E_{z ~ N(0, s^2)} [((1-q) + q e^{(2z-1)/(2 s^2)})^alpha], by the binomial
  expansion at integer orders and by quadrature at fractional ones;
* Gaussian subsampled without replacement, substitution: Wang, Balle and
  Kasiviswanathan 2019 ("Subsampled Renyi differential privacy and analytical moments
  accountant", AISTATS), Thm 27 of arXiv:1808.00087 (the Gaussian-specific form with
  forward differences) up to order 256 and Thm 9 above, at integer orders; a fractional
  order interpolates the convex cumulant between its integer neighbours (their Cor. 10).

Conversion to (epsilon, delta): epsilon = rdp + ln((alpha-1)/alpha)
- (ln delta + ln alpha) / (alpha - 1) (Canonne, Kamath and Steinke 2020, Prop. 12;
Balle, Barthe, Gaboardi, Hsu and Sato 2020, Thm 21), minimised over a grid of orders and
refined continuously; epsilon = 0 when delta >= sqrt(1 - e^{-rdp}) (total variation
against KL, Bretagnolle and Huber 1979).

The package, one concept a module:

* `orders`: the grids of orders, rounding a value up, the search over orders;
* `curves`: the curves of the mechanisms without subsampling;
* `subsampled`: the subsampled Gaussian's moments (Poisson and without replacement),
  and `sgm_epsilon`, DP-SGD's fast epsilon;
* `conversion`: RDP and zCDP to (epsilon, delta);
* `charge_curves`: a charge's curve (`charge_rdp`) and the vectors `RDPRule` adds;
* `rule`: `RDPRule`, the Renyi filter and Renyi composition of a declared plan.

`GDPFilterRule` and `gdp_epsilon` (Gaussian DP, a concept of its own) live in
`dpaccount.accounting.gdp` and are re-exported here, where they were first defined.
`Array`, `RDPState`, `GDPState`, `SGM_INTEGER_ORDERS` and `WOR_DIFFERENCE_ORDERS` are
importable from here too (``X as X``), outside `__all__`, as before the split.

Examples:
    >>> eps, order = rdp_epsilon([gaussian_rdp(1, 1, a) for a in (8.0, 9.0, 10.0)],
    ...                          [8.0, 9.0, 10.0], 1e-5)
    >>> 5.2 < eps < 5.22 and order == 8.0
    True
"""

from dpaccount.accounting.gdp import GDPFilterRule, gdp_epsilon
from dpaccount.accounting.gdp import GDPState as GDPState
from dpaccount.accounting.rdp.charge_curves import charge_rdp
from dpaccount.accounting.rdp.conversion import rdp_epsilon, zcdp_epsilon
from dpaccount.accounting.rdp.curves import (
    bounded_range_rdp,
    discrete_gaussian_rdp,
    discrete_laplace_rdp,
    gaussian_rdp,
    gaussian_zcdp,
    laplace_rdp,
    randomized_response_rdp,
)
from dpaccount.accounting.rdp.orders import DEFAULT_ORDERS, FILTER_ORDERS
from dpaccount.accounting.rdp.orders import Array as Array
from dpaccount.accounting.rdp.rule import RDPRule
from dpaccount.accounting.rdp.rule import RDPState as RDPState
from dpaccount.accounting.rdp.subsampled import SGM_INTEGER_ORDERS as SGM_INTEGER_ORDERS
from dpaccount.accounting.rdp.subsampled import WOR_DIFFERENCE_ORDERS as WOR_DIFFERENCE_ORDERS
from dpaccount.accounting.rdp.subsampled import (
    sgm_epsilon,
    subsampled_gaussian_rdp,
    wor_subsampled_gaussian_rdp,
)

__all__ = [
    "DEFAULT_ORDERS",
    "FILTER_ORDERS",
    "GDPFilterRule",
    "RDPRule",
    "bounded_range_rdp",
    "charge_rdp",
    "discrete_gaussian_rdp",
    "discrete_laplace_rdp",
    "gaussian_rdp",
    "gaussian_zcdp",
    "gdp_epsilon",
    "laplace_rdp",
    "randomized_response_rdp",
    "rdp_epsilon",
    "sgm_epsilon",
    "subsampled_gaussian_rdp",
    "wor_subsampled_gaussian_rdp",
    "zcdp_epsilon",
]
