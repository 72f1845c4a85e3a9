"""dpaccount: a differential-privacy budget guard.

Mechanisms state their privacy cost before they run; an `Accountant` composes the
costs with a proven rule and refuses any query that would exceed the budget, before the
query touches data. Budgets and sums are exact.

Examples:
    >>> import dpaccount
    >>> acct = dpaccount.Accountant(dpaccount.Budget(1, "1e-6"))
    >>> acct.charge(dpaccount.PrivacyCost("0.5")).cost
    PrivacyCost(epsilon=0.5, delta=0)
"""

import logging
from typing import TYPE_CHECKING, Any

from dpaccount.accountant import Accountant
from dpaccount.charges import (
    BoundedRangeCharge,
    DiscreteGaussianCharge,
    DiscreteLaplaceCharge,
    GaussianCharge,
    LaplaceCharge,
    Parallel,
    RandomizedResponseCharge,
    Relation,
    Repeated,
    Scheme,
    Subsampled,
)
from dpaccount.costs import Budget, PrivacyCost
from dpaccount.errors import (
    BudgetExceededError,
    ConfigError,
    DPAccountError,
    DuplicateQueryError,
    InvalidCostError,
    LedgerConflictError,
    LedgerCorruptError,
    ReadOnlyLedgerError,
    StepRefusedError,
    StorageError,
    UnreleasableResultError,
    UnsupportedChargeError,
)
from dpaccount.keys import LedgerKey
from dpaccount.ledgers import open_ledger
from dpaccount.mechanisms import (
    BLRMechanism,
    EllipticalGaussianMechanism,
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
    RandomizedResponseMechanism,
    RandomSource,
)
from dpaccount.records import LedgerRecord

# The library convention of Python's logging: a NullHandler on the package's logger and
# nothing else configured; the application attaches handlers (docs/pipelines.md, "Logging").
logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:  # imported on first use (below): they load the tight engines
    from dpaccount import aggregates
    from dpaccount.accounting import (
        PrivacyLossDistribution,
        calibrate_dpsgd_noise,
        dpsgd_epsilon,
        dpsgd_step_charge,
    )
    from dpaccount.integrations.training import TrainingLedger

__version__ = "0.1.0"

#: Names whose modules are imported when first used (PEP 562), so that ``import
#: dpaccount`` does not pay for the PLD and Renyi engines or the aggregates.
_LAZY = {
    "aggregates": ("dpaccount.aggregates", None),
    "PrivacyLossDistribution": ("dpaccount.accounting", "PrivacyLossDistribution"),
    "calibrate_dpsgd_noise": ("dpaccount.accounting", "calibrate_dpsgd_noise"),
    "dpsgd_epsilon": ("dpaccount.accounting", "dpsgd_epsilon"),
    "dpsgd_step_charge": ("dpaccount.accounting", "dpsgd_step_charge"),
    "TrainingLedger": ("dpaccount.integrations.training", "TrainingLedger"),
}


def __getattr__(name: str) -> Any:
    import importlib

    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dpaccount' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

__all__ = [
    "Accountant",
    "BLRMechanism",
    "BoundedRangeCharge",
    "Budget",
    "BudgetExceededError",
    "ConfigError",
    "DPAccountError",
    "DiscreteGaussianCharge",
    "DiscreteLaplaceCharge",
    "DuplicateQueryError",
    "EllipticalGaussianMechanism",
    "ExponentialMechanism",
    "GaussianCharge",
    "GaussianMechanism",
    "InvalidCostError",
    "LaplaceCharge",
    "LaplaceMechanism",
    "LedgerConflictError",
    "LedgerCorruptError",
    "LedgerKey",
    "LedgerRecord",
    "Mechanism",
    "Parallel",
    "PrivacyCost",
    "PrivacyLossDistribution",
    "RandomSource",
    "RandomizedResponseCharge",
    "RandomizedResponseMechanism",
    "ReadOnlyLedgerError",
    "Relation",
    "Repeated",
    "Scheme",
    "StepRefusedError",
    "StorageError",
    "Subsampled",
    "TrainingLedger",
    "UnreleasableResultError",
    "UnsupportedChargeError",
    "__version__",
    "aggregates",
    "calibrate_dpsgd_noise",
    "dpsgd_epsilon",
    "dpsgd_step_charge",
    "open_ledger",
]
