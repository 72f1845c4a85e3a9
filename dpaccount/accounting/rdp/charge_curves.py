"""The Renyi curve of a charge: at one order, and as the vectors the rule adds.

`charge_rdp` takes one run of any charge to its curve (`dpaccount.accounting.rdp.curves`
for plain mechanisms, `dpaccount.accounting.rdp.subsampled` for subsampled Gaussians,
the parts' curves for a `Parallel` charge, and for a pure epsilon-DP cost the smaller
of min(eps, alpha eps^2 / 2) and the binary randomized response's curve). `RDPRule`
adds each charge's curve at its orders as exact integers in units of 2^-52, rounded up
(`_atom_vector`), or, for a declared plan's long grid, as floats (`_atom_floats`); both
are cached per charge.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from dpaccount._numeric import check_positive, float_down, float_up
from dpaccount.accounting.rdp.curves import (
    bounded_range_rdp,
    discrete_gaussian_rdp,
    discrete_laplace_rdp,
    gaussian_rdp,
    laplace_rdp,
    randomized_response_rdp,
)
from dpaccount.accounting.rdp.orders import _REL, DEFAULT_ORDERS, Array, _check_order, _push
from dpaccount.accounting.rdp.selection import Bound, poisson_selection, tnb_selection
from dpaccount.accounting.rdp.subsampled import (
    _sgm_integer_rdp,
    subsampled_gaussian_rdp,
    wor_subsampled_gaussian_rdp,
)
from dpaccount.charges import (
    SCHEME_RELATION,
    Atom,
    BoundedRangeCharge,
    Charge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    MixtureOfGaussiansCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    RepeatAndSelect,
    Scheme,
    Subsampled,
    atoms,
    cost_of,
    shown,
)
from dpaccount.errors import InvalidCostError, UnsupportedChargeError

__all__ = ["charge_rdp"]

#: Fixed-point scale of the RDP running sums (exact integer sums: charging k times and
#: charging Repeated(c, k) once give identical states).
_SCALE = 2**52


@functools.lru_cache(maxsize=1024)
def _atom_vector(
    atom: Atom, orders: tuple[float, ...], relation: Relation
) -> npt.NDArray[np.object_]:
    """The charge's RDP at each order, as exact integers in units of 2^-52, rounded up.

    Long grids (a declared plan's) interpolate the subsampled Gaussian's fractional
    orders; the filter's short grid evaluates each of them exactly.
    """
    return _as_units(_atom_values(atom, orders, relation, interpolate=len(orders) > 64))


#: Charges whose RDP `_atom_values` evaluates in one vectorised pass at any orders.
_CLOSED_FORMS = frozenset({GaussianCharge, LaplaceCharge})


@functools.lru_cache(maxsize=1024)
def _atom_floats(atom: Atom, orders: tuple[float, ...], relation: Relation) -> Array:
    """The charge's RDP at each order as floats, rounded up (a declared plan's grid)."""
    values = _atom_values(atom, orders, relation, interpolate=len(orders) > 64)
    values.setflags(write=False)
    return values


def _as_units(values: Array) -> npt.NDArray[np.object_]:
    """Floats rounded up to exact integers in units of 2^-52 (the scaling is exact)."""
    if not np.all(np.isfinite(values)):
        raise InvalidCostError("rdp", "inf", "a Renyi divergence is unbounded at some order")
    return np.array([int(v) for v in np.ceil(values * float(_SCALE)).tolist()], dtype=object)


def _atom_values(
    atom: Atom, orders: tuple[float, ...], relation: Relation, *, interpolate: bool = True
) -> Array:
    """The charge's RDP at each order (floats, rounded up), vectorised where cheap.

    Plain Gaussians (alpha rho) are evaluated in one pass. For the Poisson-subsampled
    Gaussian the integer orders come from the vectorised binomial sum, and a fractional
    order between two integers n < alpha < n + 1 takes the linear interpolation of the
    cumulant (alpha - 1) RDP(alpha), which is convex in alpha (log-convexity of the
    moments E_Q[(P/Q)^alpha], Hoelder's inequality; a supremum over neighbouring pairs of
    convex functions is convex), so the interpolation of upper bounds is an upper bound
    (as Wang, Balle and Kasiviswanathan 2019, Cor. 10); below 2 it interpolates from
    0 at alpha = 1. Exact fractional values are used only where the optimum lies
    (`_refined_plan_epsilon`). Every other charge is evaluated order by order.
    """
    a = np.asarray(orders, dtype=np.float64)
    if type(atom) is GaussianCharge:
        rho = float_up(atom.sensitivity**2 / (2 * atom.sigma**2))
        return np.nextafter(a * rho * (1 + _REL) + 1e-300, np.inf)
    if type(atom) is LaplaceCharge:
        inv = float_up(atom.sensitivity / atom.scale)
        with np.errstate(over="ignore"):
            value = np.logaddexp(
                np.log(a / (2 * a - 1)) + (a - 1) * inv,
                np.log((a - 1) / (2 * a - 1)) - a * inv,
            ) / (a - 1)
        value = np.minimum(value, inv)
        return np.nextafter(np.maximum(value, 0.0) * (1 + _REL) + 1e-300, np.inf)
    if (
        interpolate
        and type(atom) is Subsampled
        and type(atom.charge) is GaussianCharge
        and atom.scheme is Scheme.POISSON
        and relation is Relation.ADD_REMOVE
        and atom.rate < 1
    ):
        inner = atom.charge
        q = float_up(atom.rate)
        sigma = float_down(check_positive(inner.sigma / inner.sensitivity, "noise_multiplier"))
        low = np.floor(a).astype(np.int64)
        high = np.ceil(a).astype(np.int64)
        needed = tuple(sorted({int(n) for n in np.concatenate((low, high)) if n >= 2}))
        at = dict(zip(needed, _sgm_integer_rdp(q, sigma, needed).tolist(), strict=True))
        cumulant = {n: (n - 1) * r for n, r in at.items()} | {1: 0.0}  # K(n), K(1) = 0
        k_low = np.array([cumulant[int(n)] for n in low])
        k_high = np.array([cumulant[int(n)] for n in high])
        frac = a - low
        values = np.where(frac == 0, k_low / (a - 1),
                          ((1 - frac) * k_low + frac * k_high) / (a - 1))
        return np.nextafter(np.maximum(values, 0.0) * (1 + _REL) + 1e-300, np.inf)
    return np.array([charge_rdp(atom, float(x), relation=relation) for x in a])


def charge_rdp(atom: Atom, alpha: float, *, relation: Relation = Relation.ADD_REMOVE) -> float:
    """The RDP at order ``alpha`` of one run of a charge.

    Gaussian, Laplace, the discrete Gaussian (`discrete_gaussian_rdp()`),
    Poisson-subsampled Gaussian (add/remove) and without-replacement-subsampled
    Gaussian (substitution) have their own bounds; a pure
    epsilon-DP charge has RDP at most min(eps, alpha eps^2 / 2) (Bun and
    Steinke 2016, Prop. 1.4). Other charges (delta > 0 and no noise description) have no
    RDP bound.

    Raises:
        UnsupportedChargeError: For a charge with no RDP bound or the wrong relation.
    """
    a = _check_order(alpha)
    if isinstance(atom, Subsampled):
        if SCHEME_RELATION[atom.scheme] is not relation:
            raise UnsupportedChargeError(
                f"a {atom.scheme.value}-subsampled charge is proven for "
                f"{atom.relation.value} neighbours, not {relation.value}"
            )
        inner = atom.charge
        if isinstance(inner, GaussianCharge):
            s = inner.sigma / inner.sensitivity
            if atom.scheme is Scheme.POISSON:
                return subsampled_gaussian_rdp(atom.rate, s, a)
            return wor_subsampled_gaussian_rdp(atom.rate, s, a)
    if isinstance(atom, Parallel) and atom.relation is not relation:
        raise UnsupportedChargeError(
            f"a parallel charge stated for {atom.relation.value} neighbours cannot be "
            f"composed under {relation.value}"
        )
    if isinstance(atom, Parallel):
        return _parallel_rdp(atom, a)
    if isinstance(atom, RepeatAndSelect):
        return _selection_rdp(atom, a, relation)
    if isinstance(atom, MixtureOfGaussiansCharge):
        raise UnsupportedChargeError(
            f"{shown(atom)}: the Renyi engine has no bound for a mixture of Gaussians; "
            "use rule='pld'"
        )
    if isinstance(atom, GaussianCharge):
        return gaussian_rdp(atom.sigma, atom.sensitivity, a)
    if isinstance(atom, LaplaceCharge):
        return laplace_rdp(atom.scale, atom.sensitivity, a)
    if isinstance(atom, DiscreteGaussianCharge):
        return discrete_gaussian_rdp(atom.sigma, atom.sensitivity, a)
    if isinstance(atom, DiscreteLaplaceCharge) and atom.dimension == 1:
        return discrete_laplace_rdp(atom.scale, atom.sensitivity, a)
    if isinstance(atom, RandomizedResponseCharge):
        return randomized_response_rdp(atom.epsilon, atom.categories, a)
    if isinstance(atom, BoundedRangeCharge):
        return bounded_range_rdp(atom.epsilon, a)
    cost = cost_of(atom)
    if cost.delta == 0:
        e = float_up(cost.epsilon)
        return min(_push(min(e, a * e * e / 2)), randomized_response_rdp(cost.epsilon, 2, a))
    raise UnsupportedChargeError(
        f"{shown(atom)} has delta > 0 and no noise description, so no Renyi-DP bound; "
        "describe it as a GaussianCharge/LaplaceCharge or use another rule"
    )


def _parallel_rdp(charge: Parallel, alpha: float) -> float:
    """The RDP at order ``alpha`` of disjoint parts run with independent noise.

    The outputs are independent given the data, and the Renyi divergence of a product of
    independent pairs is the sum of the pairs' divergences (Mironov 2017, Prop. 1, in its
    non-adaptive form). Under add/remove a record is in one part, so one pair differs and
    the others are equal: the largest part's RDP. Under substitution a record changes
    within one part or moves between two, so at most two pairs differ, each covered by
    its part's bound (which `check_relations` makes hold for both relations): the sum of
    the two largest. A part given as `Repeated` counts as its count of runs. Each part's
    bound is taken under the parallel charge's relation; for the leaf charges that
    parallel parts are (noise on a query) the bound is the same under either.
    """
    values = []
    known: dict[int, float] = {}  # a part that occurs again is bounded once
    for part in charge.partitions:
        value = known.get(id(part))
        if value is None:
            runs = list(atoms(part))
            if len(runs) == 1 and runs[0][1] == 1:  # one run: its bound is rounded up
                value = charge_rdp(runs[0][0], alpha, relation=charge.relation)
            else:  # products and sums may round down: push the total up
                value = _push(math.fsum(
                    count * charge_rdp(inner, alpha, relation=charge.relation)
                    for inner, count in runs
                ))
            known[id(part)] = value
        values.append(value)
    values.sort(reverse=True)
    if charge.relation is Relation.ADD_REMOVE:
        return values[0]  # each value is already rounded up
    return _push(math.fsum(values[:2]))  # a sum of two may round down: push it up


def _run_rdp(charge: Charge, alpha: float, relation: Relation) -> float:
    """The RDP at ``alpha`` of one run of ``charge`` (a `Repeated` one counts its runs;
    Mironov 2017, Prop. 1)."""
    runs = list(atoms(charge))
    if len(runs) == 1 and runs[0][1] == 1:
        return charge_rdp(runs[0][0], alpha, relation=relation)
    return _push(math.fsum(count * charge_rdp(inner, alpha, relation=relation)
                           for inner, count in runs))


@functools.lru_cache(maxsize=256)
def _selection_bound(atom: RepeatAndSelect, relation: Relation) -> Bound:
    """A repeat-and-select charge's bound, from its run's curve on the dense grid
    (computed once a charge)."""
    grid = np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    run = np.array([_run_rdp(atom.charge, float(a), relation) for a in grid])
    mean = float_up(atom.mean)
    cost = cost_of(atom.charge)
    if atom.shape is None:
        point = (float_up(cost.epsilon), float_up(cost.delta))
        return poisson_selection(grid, run, mean, point)
    pure = float_up(cost.epsilon) if cost.delta == 0 else math.inf
    return tnb_selection(grid, run, mean, float_up(atom.shape), atom.gamma, pure)


def _selection_rdp(atom: RepeatAndSelect, alpha: float, relation: Relation) -> float:
    """Papernot and Steinke 2022, Thms 2 and 6 (`dpaccount.accounting.rdp.selection`)."""
    return _selection_bound(atom, relation)(alpha, _run_rdp(atom.charge, alpha, relation))
