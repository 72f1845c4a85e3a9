"""The longest DP-SGD plan that fits a budget, in a few certified PLD evaluations.

A training run under the ``pld`` rule declares a plan of k Poisson-subsampled Gaussian
steps (noise multiplier sigma, sampling rate q) and is admitted while the certified PLD
epsilon of the whole plan at the budget's delta fits the budget (`PLDRule`). Without a
declared length, the run takes the largest such k. `plan_dpsgd_steps` finds it:

1. a starting guess from the integer-order Renyi-DP bound of the same steps (Mironov,
   Talwar and Zhang 2019; microseconds an evaluation; looser than the PLD, so its k is
   short of the answer);
2. two *surrogate* searches on the same PLD at grids 100 and then 10 times coarser
   (about 1% and 10% of the cost of one certified evaluation at large k), each a
   safeguarded secant search on (log k, log epsilon), which is nearly linear, to the
   exact crossing of its surrogate, started where the previous one ended;
3. the *certified* search: the same safeguarded secant on the rule's own test
   (`PLDRule` at the budget's delta, `PLDRule.admits`), started at the last surrogate's
   answer with its slope. It ends only when k fits and k + 1 does not, both evaluated
   (or when k reaches the limit, `MAX_PLAN_STEPS` by default, which then fits).

Counted at sigma = 1, q = 1/32, delta = 1e-5 (tests/integrations/test_plan.py): budgets
8, 30 and 1,000 (plans of 1,500, 13,072 and 1,048,822 steps) take 2 to 3 certified
evaluations each. The worst case stays O(log k): a step that does not at least halve the
bracket twice in a row is replaced by bisection, and without a failing point yet the
steps grow at least geometrically.

Why the search may assume monotonicity: the epsilon of k + 1 steps is never below that
of k steps. Releasing the first k outputs is post-processing of the k + 1 outputs
(Dwork and Roth 2014, Prop. 2.1), so every hockey-stick divergence, hence epsilon at a
fixed delta, can only grow with k; the same holds for the pessimistic discretised pair
that the rule composes (its k-fold composition is post-processing of its (k + 1)-fold
one; Zhu, Dong and Wang 2022, composition of dominating pairs). What floating point adds
(FFT error, truncated tails, both added to delta) also grows with k. Soundness never
rests on it: the plan returned is one whose certified epsilon was evaluated by the rule
itself and fits; monotonicity only makes it the largest.

A plan is searched from public numbers only (sigma, q, the budget), never from data.
Plans are cached per (sigma, q, delta, epsilon, grid).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import attrs

from dpaccount._numeric import check_count, check_positive, float_down
from dpaccount.accounting.dpsgd import dpsgd_step_charge
from dpaccount.accounting.pld import DEFAULT_INTERVAL, PLDRule, PrivacyLossDistribution
from dpaccount.accounting.rdp import sgm_epsilon
from dpaccount.charges import GaussianCharge, Repeated
from dpaccount.costs import Budget, as_budget
from dpaccount.errors import ConfigError, InvalidCostError

__all__ = ["MAX_PLAN_STEPS", "StepPlan", "clear_plan_cache", "plan_dpsgd_steps"]

#: The most steps a searched plan may hold. One certified PLD evaluation of 10^7 steps
#: takes about 9 s of CPU and a few hundred MB here (its grid grows like sqrt(k)); 10^9
#: would need tens of GB. A budget that admits more gets a plan of exactly this many
#: steps (`StepPlan.capped`), far beyond any training run.
MAX_PLAN_STEPS = 10**7
#: How much coarser the surrogates' grids are than the certified one, searched in turn.
SURROGATE_COARSENING = (100, 10)
#: How many plans are kept (each is a few integers).
PLAN_CACHE = 64

#: Evaluations of a search: certified (the rule's own test) and surrogate (coarse grid).
_Evaluate = Callable[[int], tuple[bool, float]]


@attrs.frozen
class StepPlan:
    """The longest plan of equal DP-SGD steps that fits a budget.

    Attributes:
        steps: The plan's length (0: not even one step fits).
        epsilon: The certified PLD epsilon of the plan at the budget's delta (0.0 for
            no steps), as the rule computed it.
        capped: Whether the plan reached the search's limit (`MAX_PLAN_STEPS` unless a
            lower one was given): the budget may admit more steps than it holds.
        evaluations: Certified PLD evaluations the search made (0 when cached).
        surrogate_evaluations: Coarse-grid evaluations it made.
        rule: The `PLDRule` of the plan, already composed (kept for the latest search
            only, else None): an accountant can be built on it without composing the
            plan again.
    """

    steps: int
    epsilon: float
    capped: bool
    evaluations: int
    surrogate_evaluations: int
    rule: PLDRule | None = attrs.field(default=None, eq=False, repr=False)


_CACHE: dict[tuple[Fraction, Fraction, Fraction, Fraction, float, int], StepPlan] = {}
#: The composed rule of the latest search (its key, the rule): a rule holds the whole
#: plan's PLD (tens of MB at a million steps), so only one is kept. A rule is not changed
#: by use (its state lives in the accountant), so ledgers may share it.
_LAST_RULE: list[Any] = []


def plan_dpsgd_steps(*, noise_multiplier: Any, sampling_rate: Any, budget: Any,
                     value_discretization_interval: Any = DEFAULT_INTERVAL,
                     limit: int = MAX_PLAN_STEPS) -> StepPlan:
    """The largest number of DP-SGD steps whose certified PLD epsilon fits ``budget``.

    Each certified evaluation is `PLDRule` on the plan ``(step, k)`` at the budget's
    delta with `PLDRule.admits` (the same test the ledger applies to every step), so
    the returned plan is admitted by the rule that will keep the run. See the module
    docstring for the search and why epsilon grows with k.

    Args:
        noise_multiplier: sigma / clipping norm, > 0.
        sampling_rate: The Poisson sampling rate q in (0, 1].
        budget: The run's budget (a `Budget`, a number or an (epsilon, delta) pair).
        value_discretization_interval: The PLD grid of the rule (``PLDRule``'s).
        limit: The longest plan searched, at most `MAX_PLAN_STEPS`.

    Returns:
        A `StepPlan` (``steps == 0`` if no step fits).

    Raises:
        InvalidCostError: sigma <= 0, q outside (0, 1], NaN or infinite numbers, or a
            budget without an epsilon.
        ConfigError: ``limit`` above `MAX_PLAN_STEPS`.

    Examples:
        >>> plan = plan_dpsgd_steps(noise_multiplier=1.0, sampling_rate=0.01,
        ...                         budget=(1, "1e-5"))
        >>> plan.steps, plan.capped
        (254, False)
    """
    the_budget = as_budget(budget)
    if the_budget.epsilon is None:
        raise InvalidCostError("budget", "rho or unlimited", "a DP-SGD plan needs an epsilon")
    most = check_count(limit, "limit")
    if most > MAX_PLAN_STEPS:
        raise ConfigError(
            f"a searched plan holds at most {MAX_PLAN_STEPS} steps (one PLD evaluation of "
            "more would not fit in memory); declare steps= for a shorter run"
        )
    step = dpsgd_step_charge(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate)
    inner = step.charge
    if not isinstance(inner, GaussianCharge):  # pragma: no cover - dpsgd_step_charge's
        raise ConfigError("a DP-SGD step is a subsampled Gaussian")
    sigma, q = inner.sigma, step.rate
    interval = float(check_positive(value_discretization_interval,
                                    "value_discretization_interval"))
    key = (sigma, q, the_budget.delta, the_budget.epsilon, interval, most)
    cached = _CACHE.get(key)
    if cached is not None:
        rule = _LAST_RULE[1] if _LAST_RULE and _LAST_RULE[0] == key else None
        return attrs.evolve(cached, evaluations=0, surrogate_evaluations=0, rule=rule)
    plan = _search(step, sigma, q, the_budget, the_budget.epsilon, interval, most)
    if len(_CACHE) >= PLAN_CACHE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = attrs.evolve(plan, rule=None)
    _LAST_RULE[:] = [key, plan.rule] if plan.rule is not None else []
    return plan


def clear_plan_cache() -> None:
    """Forget every cached plan (the next search evaluates again)."""
    _CACHE.clear()
    _LAST_RULE.clear()


def _search(step: Any, sigma: Fraction, q: Fraction, budget: Budget, epsilon: Fraction,
            interval: float, limit: int) -> StepPlan:
    cap = float_down(min(epsilon, Fraction(10**300)))
    rules: dict[int, PLDRule] = {}
    values: dict[int, float] = {}

    def certified(k: int) -> tuple[bool, float]:
        rule = PLDRule((step, k), budget=budget, value_discretization_interval=interval)
        state = rule.extend(rule.start(), Repeated(step, k) if k > 1 else step)
        fits = rule.admits(state, budget)
        try:
            value = float(rule.total(state).epsilon)
        except InvalidCostError:
            value = math.inf
        if fits:
            rules[k] = rule
        values[k] = value
        return fits, value

    def surrogate(coarsening: int) -> _Evaluate:
        coarse = PrivacyLossDistribution.gaussian(
            sigma, 1, sampling_rate=q,
            value_discretization_interval=interval * coarsening, lower=False,
        )

        def evaluate(k: int) -> tuple[bool, float]:
            _low, high = coarse.self_compose(k).epsilon(budget.delta)
            value = math.inf if high is None else float(high)
            return value <= cap, value

        return evaluate

    found, slope = _rdp_guess(q, sigma, budget.delta, cap, limit)
    surrogate_count = 0
    for coarsening in SURROGATE_COARSENING:
        found, seen, count = _largest_fitting(surrogate(coarsening), cap, max(found, 1),
                                              slope, limit)
        slope = _local_slope(seen, found) or slope
        surrogate_count += count
    steps, _seen, count = _largest_fitting(certified, cap, max(found, 1), slope, limit)
    if steps == 0:
        return StepPlan(0, 0.0, False, count, surrogate_count)
    return StepPlan(steps, values[steps], steps == limit, count, surrogate_count,
                    rules[steps])


def _rdp_guess(q: Fraction, sigma: Fraction, delta: Fraction, cap: float, limit: int
               ) -> tuple[int, float | None]:
    """Where the (refined) RDP epsilon crosses ``cap``, to about 1%, and its slope.

    RDP is an upper bound too, so the PLD's crossing lies at or beyond it; only a
    starting point (1 when delta is 0, where RDP says nothing)."""
    if delta == 0:
        return 1, None

    def rdp(k: int) -> float:
        try:
            return sgm_epsilon(q, sigma, k, delta, refine=False)
        except InvalidCostError:  # pragma: no cover - delta is checked above
            return math.inf

    if rdp(1) > cap:
        return 1, None
    lo, hi = 1, 2
    while hi <= limit and rdp(hi) <= cap:
        lo, hi = hi, hi * 2
    if hi > limit:
        return limit, None
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rdp(mid) <= cap else (lo, mid)
    span = max(1, lo // 100)
    return lo, (rdp(lo + span) - rdp(lo)) / span or None


def _local_slope(seen: dict[int, float], k: int) -> float | None:
    """d epsilon / d k from the two finite points nearest to ``k``."""
    near = sorted((p for p in seen if math.isfinite(seen[p])), key=lambda p: abs(p - k))
    if len(near) < 2:
        return None
    a, b = near[:2]
    slope = (seen[b] - seen[a]) / (b - a)
    return slope if slope > 0 else None


def _estimate(seen: dict[int, float], cap: float, k: int, slope: float | None
              ) -> float | None:
    """Where epsilon crosses ``cap``: a secant on (log k, log epsilon) through the two
    finite points closest to it, or the slope hint from the last point ``k``."""
    finite = [(p, v) for p, v in seen.items() if math.isfinite(v) and v > 0]
    finite.sort(key=lambda item: abs(math.log(item[1] / cap)))
    if len(finite) >= 2:
        (k1, v1), (k2, v2) = finite[:2]
        power = (math.log(v2) - math.log(v1)) / (math.log(k2) - math.log(k1))
        if power > 0:
            return k1 * math.exp(math.log(cap / v1) / power)
    value = seen.get(k, math.inf)
    if slope and math.isfinite(value):
        return k + (cap - value) / slope
    return None


def _largest_fitting(evaluate: _Evaluate, cap: float, guess: int, slope: float | None,
                     limit: int) -> tuple[int, dict[int, float], int]:
    """The largest k in [0, limit] with ``evaluate(k)`` fitting, for a monotone test.

    A safeguarded secant search: it returns k only once k fits (or is 0) and k + 1
    does not (or k is ``limit``), both evaluated. Bisection replaces a secant step that
    fails to halve the bracket twice in a row; without a failing point, steps at least
    double after three fitting ones. Returns (k, the values seen, how many evaluations).
    """
    lo, hi = 0, None
    seen: dict[int, float] = {}
    widths: list[int] = []
    rises = 0
    k = min(max(1, guess), limit)
    while True:
        fits, value = evaluate(k)
        seen[k] = value
        if fits:
            rises = rises + 1 if hi is None else 0
            lo = k
        else:
            hi = k
        if lo == limit or (hi is not None and hi - lo <= 1):
            return lo, seen, len(seen)
        estimate = _estimate(seen, cap, k, slope)
        candidate = lo + 1 if estimate is None else math.floor(estimate)
        if hi is None:
            candidate = max(candidate, lo + 1)
            if estimate is None or rises >= 4:
                candidate = max(candidate, 2 * lo)
            k = min(candidate, limit)
            continue
        widths.append(hi - lo)
        halving = len(widths) < 3 or widths[-1] * 4 <= widths[-3]
        if estimate is None or not halving:
            candidate = (lo + hi) // 2
        k = min(max(candidate, lo + 1), hi - 1)
