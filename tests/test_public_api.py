"""The public API is what __all__ says, and every public name is documented."""

from __future__ import annotations

import inspect

import dpaccount

EXPECTED = {
    "Accountant", "Budget", "BudgetExceededError", "ConfigError", "DPAccountError",
    "DuplicateQueryError", "GaussianCharge", "InvalidCostError", "LaplaceCharge",
    "LedgerConflictError", "LedgerCorruptError", "LedgerRecord", "Parallel", "PrivacyCost",
    "Relation", "Repeated", "Scheme", "StorageError", "Subsampled",
    "UnsupportedChargeError", "__version__", "open_ledger", "ExponentialMechanism",
    "GaussianMechanism", "LaplaceMechanism", "Mechanism", "RandomSource",
    "BLRMechanism", "EllipticalGaussianMechanism", "RandomizedResponseMechanism", "aggregates",
    "PrivacyLossDistribution", "calibrate_dpsgd_noise", "DiscreteGaussianCharge",
    "DiscreteLaplaceCharge", "dpsgd_epsilon", "dpsgd_step_charge",
    "UnreleasableResultError", "StepRefusedError", "TrainingLedger",
    "BoundedRangeCharge", "RandomizedResponseCharge", "LedgerKey", "ReadOnlyLedgerError",
}


def test_all_is_pinned() -> None:
    assert set(dpaccount.__all__) == EXPECTED
    assert len(dpaccount.__all__) == len(set(dpaccount.__all__))


def test_every_public_name_exists_and_is_documented() -> None:
    for name in dpaccount.__all__:
        obj = getattr(dpaccount, name)
        if name == "__version__":
            continue
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or (not callable(member) and not isinstance(
                    member, property
                )):
                    continue
                assert inspect.getdoc(member), f"{name}.{attr} has no docstring"


def test_error_tree() -> None:
    assert issubclass(dpaccount.InvalidCostError, ValueError)
    assert issubclass(dpaccount.ConfigError, ValueError)
    for err in (dpaccount.LedgerConflictError, dpaccount.LedgerCorruptError):
        assert issubclass(err, dpaccount.StorageError)
    for name in dpaccount.__all__:
        obj = getattr(dpaccount, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, dpaccount.DPAccountError)
