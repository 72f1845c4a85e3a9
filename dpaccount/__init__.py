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

from dpaccount import aggregates
from dpaccount.accountant import Accountant
from dpaccount.accounting import (
    PrivacyLossDistribution,
    calibrate_dpsgd_noise,
    dpsgd_epsilon,
    dpsgd_step_charge,
)
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
    StepRefusedError,
    StorageError,
    UnreleasableResultError,
    UnsupportedChargeError,
)
from dpaccount.integrations.training import TrainingLedger
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

__version__ = "0.1.0"

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
    "LedgerRecord",
    "Mechanism",
    "Parallel",
    "PrivacyCost",
    "PrivacyLossDistribution",
    "RandomSource",
    "RandomizedResponseCharge",
    "RandomizedResponseMechanism",
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
