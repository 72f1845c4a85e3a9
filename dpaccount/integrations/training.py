"""One training run's privacy budget, kept in a dpaccount ledger (framework-free).

`TrainingLedger` charges DP-SGD steps (Poisson-subsampled Gaussians, add/remove
neighbours: `dpsgd_step_charge`) to an `Accountant` before they are applied, and
rebuilds the run's history from the ledger after a restart. The Opacus adapter
(`dpaccount.integrations.opacus`) and the JAX helper (`dpaccount.integrations.jax`)
are thin layers over it.

Which rule keeps the run:

* ``rule="pld"`` (default, tightest): a declared plan of ``steps`` steps at one noise
  multiplier and sampling rate, accounted on the privacy loss distribution (Dong, Roth
  and Su 2019, Thm 3.2; Zhu, Dong and Wang 2022, Thm 10: proven for adaptively chosen
  mechanisms with the declared parameters). With ``steps=None`` the plan is the largest
  number of steps whose certified epsilon fits the budget, computed from public numbers
  only (sigma, q, the budget), so the plan, and where the run stops, do not depend on the
  data. The ledger is created when the first step tells sigma and q; a resumed run must
  use the same sigma and q (anything else is refused with `UnsupportedChargeError`).
* ``rule="rdp"``: the Renyi filter (Feldman and Zrnic 2021, Thm 3.1), proven when sigma
  or q are chosen during training (noise schedules); looser.
* an `Accountant` you built: its own rule decides.

Stopping early (on a validation metric) is covered by every rule: a prefix of a run is
post-processing of the whole run.

Examples:
    >>> run = TrainingLedger("memory://", budget=(1, "1e-5"))
    >>> run.charge_steps(noise_multiplier=1.0, sampling_rate=0.01, steps=10)
    >>> run.steps_taken, run.history
    (10, [(1.0, 0.01, 10)])
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from fractions import Fraction
from typing import Any

from dpaccount._numeric import check_count, check_delta, float_down, float_up
from dpaccount.accountant import Accountant
from dpaccount.accounting.dpsgd import dpsgd_step_charge
from dpaccount.accounting.dpsgd_plan import MAX_PLAN_STEPS, plan_dpsgd_steps
from dpaccount.accounting.pld import DEFAULT_INTERVAL, compose_plan
from dpaccount.charges import (
    GaussianCharge,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
    cost_of,
)
from dpaccount.costs import PrivacyCost, as_budget
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidCostError,
    StepRefusedError,
    StorageError,
    UnsupportedChargeError,
)
from dpaccount.ledgers import open_ledger, open_store
from dpaccount.records import LedgerMeta, LedgerRecord

__all__ = [
    "TrainingLedger",
    "epsilon_bounds_of_history",
    "epsilon_of_history",
    "max_planned_steps",
]

#: The label of every step record a `TrainingLedger` writes.
STEP_LABEL = "dp-sgd step"
#: The most steps a plan may hold (searched or declared): `MAX_PLAN_STEPS`.
MAX_PLANNED_STEPS = MAX_PLAN_STEPS


def _step_parameters(charge: Any) -> tuple[Fraction, Fraction, int] | None:
    """(sigma, q, count) of a DP-SGD step charge (or a Repeated one), else None."""
    count = 1
    if isinstance(charge, Repeated):
        charge, count = charge.charge, charge.count
    if (
        isinstance(charge, Subsampled)
        and charge.scheme is Scheme.POISSON
        and isinstance(charge.charge, GaussianCharge)
        and charge.charge.sensitivity == 1
    ):
        return charge.charge.sigma, charge.rate, count
    return None


def max_planned_steps(*, noise_multiplier: Any, sampling_rate: Any, budget: Any) -> int:
    """The largest number of DP-SGD steps whose PLD plan fits ``budget`` (0 if none).

    The same test as the ``pld`` rule's (its certified epsilon at the budget's delta),
    found in a few evaluations by `plan_dpsgd_steps` (see there for the search, its
    cache and the cap `MAX_PLANNED_STEPS`). Depends on public numbers only.

    Examples:
        >>> max_planned_steps(noise_multiplier=1.0, sampling_rate=0.01,
        ...                   budget=(1, "1e-5"))
        254
    """
    return plan_dpsgd_steps(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
                            budget=budget).steps


def epsilon_of_history(history: list[tuple[Any, Any, int]], delta: Any, *,
                       value_discretization_interval: Any = DEFAULT_INTERVAL) -> float:
    """Certified epsilon at ``delta`` of the steps in ``history`` ((sigma, q, count)).

    The PLD of all the steps composed (Dong, Roth and Su 2019, Thm 3.2), rounded up;
    0 for no steps, inf if no finite epsilon reaches ``delta``. Valid for the steps as
    they were taken when their parameters did not depend on the data.

    Examples:
        >>> e = epsilon_of_history([(1.0, 0.01, 100)], 1e-5)
        >>> 0.7 < e < 0.75
        True
    """
    d = check_delta(delta, "delta")
    plan = [
        (dpsgd_step_charge(noise_multiplier=sigma, sampling_rate=q), count)
        for sigma, q, count in history
        if count > 0
    ]
    if not plan:
        return 0.0
    pld = compose_plan(
        [Repeated(step, count) for step, count in plan],
        relation=Relation.ADD_REMOVE,
        value_discretization_interval=value_discretization_interval,
        lower=False,
    )
    _low, high = pld.epsilon(d)
    if high is None:
        return math.inf
    return float_up(high)


def epsilon_bounds_of_history(history: list[tuple[Any, Any, int]], delta: Any, *,
                              value_discretization_interval: Any = DEFAULT_INTERVAL
                              ) -> tuple[float, float]:
    """(lower, upper) epsilon at ``delta`` of the steps in ``history`` ((sigma, q, count)).

    ``upper`` is `epsilon_of_history`'s certified bound (the pessimistic, "connect the
    dots" discretisation of Doroshenko, Ghazi, Kamath, Kumar and Manurangsi 2022, with
    floating-point error added to delta), rounded up; inf if no finite epsilon reaches
    ``delta``. ``lower`` comes from the *same* PLD's optimistic discretisation (the
    output binned by its loss, losses rounded down: post-processing of the dominating
    pair, so its hockey-stick divergence is at most the pair's; Meiser and Mohammadi
    2018), rounded down. The dominating pair of a Poisson-subsampled Gaussian step is
    attained by a pair of neighbouring datasets (the differing example's clipped
    gradient of norm exactly C, every other one 0: Koskela, Jalko and Honkela 2020,
    Sec. 6; Zhu, Dong and Wang 2022, Sec. 5), so for the worst-case model and data no
    accountant that knows only (sigma, q, steps) can certify an epsilon below ``lower``:
    the exact epsilon lies in [lower, upper]. Costs two PLD compositions (both
    discretisations).

    Examples:
        >>> low, high = epsilon_bounds_of_history([(1.0, 0.01, 100)], 1e-5)
        >>> 0.7 < low <= high < 0.75 and high - low < 0.01
        True
    """
    d = check_delta(delta, "delta")
    plan = [
        Repeated(dpsgd_step_charge(noise_multiplier=sigma, sampling_rate=q), count)
        for sigma, q, count in history
        if count > 0
    ]
    if not plan:
        return 0.0, 0.0
    pld = compose_plan(plan, relation=Relation.ADD_REMOVE,
                       value_discretization_interval=value_discretization_interval,
                       lower=True)
    low, high = pld.epsilon(d)
    return float_down(low), (math.inf if high is None else float_up(high))


class TrainingLedger:
    """The privacy budget of one training run, charged step by step before use.

    Args:
        ledger: A ledger URL (``memory://``, ``sqlite:///run.db``,
            ``postgresql://...``) or an `Accountant` (whose rule then decides).
        name: The ledger's name at the URL (one per run or per dataset).
        budget: The run's budget (needed with a URL).
        rule: ``"pld"`` (declared plan; default) or ``"rdp"`` (Renyi filter), with a URL.
        steps: The plan's length for ``"pld"``; None takes the most that fit.
        label: The label of the step records (the history is rebuilt from them).

    Raises:
        ConfigError: A URL without a budget, an unknown rule, or an `Accountant` whose
            relation is not add/remove (DP-SGD's).
    """

    def __init__(
        self,
        ledger: str | Accountant,
        *,
        name: str = "training",
        budget: Any = None,
        rule: str = "pld",
        steps: int | None = None,
        label: str = STEP_LABEL,
    ) -> None:
        self.label = label
        self._url: str | None = None
        self._acct: Accountant | None = None
        self._planned: tuple[Subsampled, int] | None = None
        self._plan_fits = False
        self._last_step: tuple[tuple[Any, Any], Subsampled] | None = None
        self._ahead: tuple[tuple[Any, Any], Future[None]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        if isinstance(ledger, Accountant):
            if ledger.relation is not Relation.ADD_REMOVE:
                raise ConfigError(
                    "DP-SGD steps are accounted under add/remove neighbours (Poisson "
                    f"sampling); this accountant's relation is {ledger.relation.value!r}"
                )
            self._acct, self._name = ledger, ledger.name
            self._taken = self._count_taken()
            return
        if budget is None:
            raise ConfigError("a training ledger opened by URL needs budget=")
        if rule not in ("pld", "rdp"):
            raise ConfigError(f"unknown training rule {rule!r}; use 'pld' or 'rdp'")
        self._url, self._name, self._budget, self._rule = ledger, name, as_budget(budget), rule
        self._steps = None if steps is None else check_count(steps, "steps")
        if self._steps is not None and self._steps > MAX_PLANNED_STEPS:
            raise ConfigError(
                f"a plan holds at most {MAX_PLANNED_STEPS} steps (one PLD evaluation of "
                "more would not fit in memory); split a longer run over ledgers"
            )
        self._taken = self._count_taken()
        if rule == "rdp":
            self._acct = open_ledger(ledger, name=name, budget=self._budget, rule="rdp")
            self._taken = self._count_taken()

    # -- opening ---------------------------------------------------------------------

    def _count_taken(self) -> int:
        return sum(count for _s, _q, count in self.history)

    def _history_of(self, records: Sequence[LedgerRecord]) -> list[tuple[float, float, int]]:
        history: list[tuple[float, float, int]] = []
        for record in records:
            if record.label != self.label:
                continue
            found = _step_parameters(record.charge)
            if found is None:
                continue
            sigma, q, count = float(found[0]), float(found[1]), found[2]
            if history and history[-1][:2] == (sigma, q):
                history[-1] = (sigma, q, history[-1][2] + count)
            else:
                history.append((sigma, q, count))
        return history

    def _stored(self) -> tuple[LedgerMeta | None, Sequence[LedgerRecord]]:
        """What the URL holds before the ledger is opened with its rule (read only)."""
        if self._url is None or self._url.startswith("memory:"):
            return None, []
        try:
            store = open_store(self._url, name=self._name, create=False)
        except StorageError:  # no ledger there yet; opening it for real reports the rest
            return None, []
        try:
            meta = getattr(store, "stored_meta", lambda: None)()
            return meta, ([] if meta is None else store.read())
        finally:
            store.close()

    def _stored_plan(self, step: Subsampled) -> int | None:
        """The plan length of an existing ledger for this step, if it has one."""
        meta, _records = self._stored()
        if meta is None:
            return None
        plan = meta.rule.get("plan") if isinstance(meta.rule, dict) else None
        if meta.rule.get("name") != "pld" or not plan or len(plan) != 1:
            return None
        described, count = plan[0]
        if described != repr(step):
            raise UnsupportedChargeError(
                f"the training ledger {self._name!r} was planned for other DP-SGD steps "
                f"({described}); resume with the same noise multiplier and sampling rate, "
                "or keep runs that change them in a ledger with rule='rdp'"
            )
        return int(count)

    def start(self, *, noise_multiplier: Any, sampling_rate: Any) -> Accountant:
        """Open (or create) the ledger for steps of this sigma and q; idempotent.

        With the ``pld`` rule this is where the plan is fixed (and, for a new ledger with
        ``steps=None``, searched by `plan_dpsgd_steps`: 2 to 3 certified PLD evaluations,
        and the ledger is opened on the rule the search composed).
        """
        if self._acct is not None:
            return self._acct
        assert self._url is not None
        step = self._step(noise_multiplier, sampling_rate)
        planned = self._stored_plan(step)
        rule: Any = None
        if planned is None:
            if self._steps is not None:
                planned = self._steps
            else:
                searched = plan_dpsgd_steps(noise_multiplier=noise_multiplier,
                                            sampling_rate=sampling_rate, budget=self._budget)
                planned, rule = searched.steps, searched.rule
        if planned == 0:
            self._refuse(step, 1, computed=False, accountant=None)
        if rule is not None:  # the search's rule, already composed: no second evaluation
            self._acct = open_ledger(self._url, name=self._name, budget=self._budget,
                                     rule=rule)
        else:
            self._acct = open_ledger(self._url, name=self._name, budget=self._budget,
                                     rule="pld", plan=(step, planned))
        self._planned = (step, planned)
        rule = self._acct.rule  # the whole plan's total is precomputed: an O(1) check
        self._plan_fits = rule.admits(rule.extend(rule.start(), Repeated(step, planned)),
                                      self._acct.budget)
        self._taken = self._count_taken()
        return self._acct

    def _step(self, noise_multiplier: Any, sampling_rate: Any) -> Subsampled:
        """The step charge of this sigma and q, validated once: the last one is kept for
        the same two floats (a NaN never equals itself, so it is validated, and refused,
        every time)."""
        key = (noise_multiplier, sampling_rate)
        if (self._last_step is not None and type(noise_multiplier) is float
                and type(sampling_rate) is float and self._last_step[0] == key):
            return self._last_step[1]
        step = dpsgd_step_charge(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate)
        self._last_step = (key, step)
        return step

    # -- charging ----------------------------------------------------------------------

    @property
    def accountant(self) -> Accountant | None:
        """The ledger's `Accountant` (None until the first step of a ``pld`` run)."""
        return self._acct

    @property
    def ledger_name(self) -> str:
        """The ledger's name (what checkpoints record, with `steps_taken`)."""
        return self._name

    @property
    def steps_taken(self) -> int:
        """Steps admitted so far, in this process and before a restart (a step paid
        ahead with `prepay` counts once its charge is durable; see `steps_applied`)."""
        return self._taken

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(noise multiplier, sampling rate, steps) of the admitted steps, in order.

        Before the first step of a resumed ``pld`` run the ledger is read without being
        opened (its plan needs sigma and q); it is verified when the run starts.
        """
        if self._acct is not None:
            return self._history_of(self._acct.records)
        return self._history_of(self._stored()[1])

    def steps_left(self, *, noise_multiplier: Any, sampling_rate: Any) -> int | None:
        """How many more steps of this sigma and q are admitted now (None: unbounded).

        For a ``pld`` plan whose whole length fits (checked once, when the run starts) it
        is the plan's length less the steps taken, in O(1); otherwise the accountant
        searches (`Accountant.max_queries`). Either way each charge is still checked by
        the ledger's rule.
        """
        acct = self.start(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate)
        step = self._step(noise_multiplier, sampling_rate)
        if self._planned is not None and self._plan_fits and step == self._planned[0]:
            return max(0, self._planned[1] - self._taken)
        return acct.max_queries(step)

    def charge_steps(self, *, noise_multiplier: Any, sampling_rate: Any, steps: int = 1,
                     computed: bool = False) -> None:
        """Record ``steps`` steps before they are applied, or refuse them all.

        Args:
            noise_multiplier: sigma / clipping norm of the steps.
            sampling_rate: Their Poisson sampling rate q.
            steps: How many steps (one ``Repeated`` record).
            computed: Whether the gradient of the (first) step is already computed; only
                changes what the refusal says.

        Raises:
            StepRefusedError: The steps do not fit; nothing was recorded.
            UnsupportedChargeError: The ledger's rule cannot take them (another sigma or
                q than a ``pld`` ledger's plan).
            InvalidCostError: sigma <= 0, q outside (0, 1], NaN or infinite numbers, or
                more than `MAX_PLANNED_STEPS` steps at once; nothing was recorded.
        """
        n = check_count(steps, "steps")
        if n > MAX_PLANNED_STEPS:
            raise InvalidCostError("steps", n, f"more than {MAX_PLANNED_STEPS} in one charge")
        if self._ahead is not None:
            key, future = self._ahead
            self._ahead = None
            future.result()  # durable before the step is applied, or its refusal raised
            if n == 1 and key == (noise_multiplier, sampling_rate):
                return  # this step was paid ahead
            # Paid ahead for other values: that charge stays (never refunded).
        self._charge(noise_multiplier, sampling_rate, n, computed)

    def prepay(self, *, noise_multiplier: Any, sampling_rate: Any) -> None:
        """Charge the next step now, durably, in a background thread.

        The next `charge_steps` of one step with the same values waits for that charge
        to be durable (or raises its refusal: nothing recorded) instead of charging
        again, so the durable append overlaps whatever runs in between (the device's
        forward and backward pass). At most one step is paid ahead; a run that stops
        (or crashes) after a prepay has one charged step that never ran (charges are
        never refunded). `steps_taken` counts it once durable; `steps_applied` does not.

        Raises:
            InvalidCostError: Bad numbers (checked here, before the thread starts).
        """
        if self._ahead is not None:
            return
        self._step(noise_multiplier, sampling_rate)  # validate in the caller's thread
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="dpaccount-prepay")
        future = self._executor.submit(self._charge, noise_multiplier, sampling_rate, 1, True)
        self._ahead = ((noise_multiplier, sampling_rate), future)

    @property
    def steps_applied(self) -> int:
        """`steps_taken` less a step paid ahead (`prepay`) and not yet consumed: the
        steps a model saved now has applied. Waits for a pending prepay."""
        if self._ahead is None:
            return self._taken
        if wait([self._ahead[1]]).done and self._ahead[1].exception() is None:
            return self._taken - 1
        return self._taken

    def _charge(self, noise_multiplier: Any, sampling_rate: Any, n: int,
                computed: bool) -> None:
        acct = self.start(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate)
        step = self._step(noise_multiplier, sampling_rate)
        charge = step if n == 1 else Repeated(step, n)
        if self._planned is not None:
            planned_step, planned = self._planned
            if step != planned_step:
                sigma, q, _count = _step_parameters(planned_step) or (0, 0, 0)
                raise UnsupportedChargeError(
                    f"this run's ledger holds a plan of {planned} steps at noise multiplier "
                    f"{float(sigma)!r} and sampling rate {float(q)!r}; a step with other "
                    "values is not in it (keep runs that change them in a ledger with "
                    "rule='rdp')"
                )
            if self._taken + n > planned:
                self._refuse(step, n, computed=computed, accountant=acct)
        try:
            acct.charge(charge, label=self.label)
        except BudgetExceededError as refused:
            raise StepRefusedError(refused, step=self._taken, steps=n,
                                   computed=computed) from None
        self._taken += n

    def _refuse(self, step: Subsampled, n: int, *, computed: bool,
                accountant: Accountant | None) -> None:
        """Refuse ``n`` steps past a plan: the would-be total is their certified PLD."""
        budget = self._budget if accountant is None else accountant.budget
        spent = PrivacyCost(0) if accountant is None else accountant.spent
        sigma, q, _count = _step_parameters(step) or (0, 0, 0)
        eps = epsilon_of_history([(sigma, q, self._taken + n)], budget.delta)
        would_be = PrivacyCost(Fraction(eps) if math.isfinite(eps) else Fraction(10**9),
                               budget.delta)
        refused = BudgetExceededError(cost_of(Repeated(step, n)), spent, budget, would_be, "pld")
        raise StepRefusedError(refused, step=self._taken, steps=n, computed=computed)

    def chunks(self, *, noise_multiplier: Any, sampling_rate: Any, total_steps: int,
               chunk_size: int) -> Iterator[int]:
        """Charge and yield chunk lengths until ``total_steps`` ran or the budget is out.

        Each chunk is charged (one ``Repeated`` record) before it is yielded, so the
        caller runs it only once it is paid for; the last chunks shrink to what the
        budget still admits, and iteration stops when not even one step fits (check
        `steps_taken` against what you wanted).
        """
        total = check_count(total_steps, "total_steps", minimum=0)
        size = check_count(chunk_size, "chunk_size")
        done = 0
        while done < total:
            want = min(size, total - done)
            left = self.steps_left(noise_multiplier=noise_multiplier,
                                   sampling_rate=sampling_rate)
            if left is not None:
                want = min(want, left)
            if want <= 0:
                return
            self.charge_steps(noise_multiplier=noise_multiplier,
                              sampling_rate=sampling_rate, steps=want)
            done += want
            yield want

    def epsilon(self, delta: Any) -> float:
        """Certified epsilon at ``delta`` of the steps admitted so far (PLD, rounded up)."""
        return epsilon_of_history(self.history, delta)

    def epsilon_bounds(self, delta: Any) -> tuple[float, float]:
        """(lower, upper) epsilon at ``delta`` of the steps so far: upper is certified
        (`epsilon`), lower is what no accountant can beat (`epsilon_bounds_of_history`)."""
        return epsilon_bounds_of_history(self.history, delta)

    def close(self) -> None:
        """Close the ledger's store (after a pending `prepay` has finished; its refusal,
        if any, is dropped: it recorded nothing)."""
        if self._ahead is not None:
            wait([self._ahead[1]])
            self._ahead = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._acct is not None:
            self._acct.store.close()

    def __repr__(self) -> str:
        return f"TrainingLedger(steps_taken={self._taken}, accountant={self._acct!r})"
