"""Tight accounting engines: privacy loss distributions (PLD), Renyi DP (RDP), Gaussian DP.

| rule | proven for | theorem |
|---|---|---|
| ``pld`` | adaptive mechanisms, declared plan | Dong-Roth-Su 2019 Thm 3.2; Zhu-Dong-Wang 2022 |
| ``rdp`` | fully adaptive (Renyi filter) | Feldman-Zrnic 2021 Thm 3.1 |
| ``gdp`` | fully adaptive, plain Gaussians | Smith-Thakurta 2022 Thm 1.1 |

The engines live in `dpaccount.accounting.pld` and `dpaccount.accounting.rdp`
(packages, one concept a module), `dpaccount.accounting.gdp` and
`dpaccount.accounting.dpsgd`; they import from `dpaccount.composition` only the rule
interface, and are named by the registry there (`dpaccount.composition.RULES`).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # each engine's module is imported on first use (below)
    from dpaccount.accounting.dpsgd import (
        calibrate_dpsgd_noise,
        dpsgd_epsilon,
        dpsgd_epsilon_bounds,
        dpsgd_schedule,
        dpsgd_step_charge,
    )
    from dpaccount.accounting.gdp import GDPFilterRule, gdp_epsilon
    from dpaccount.accounting.pld import PLDRule, PrivacyLossDistribution, compose_plan
    from dpaccount.accounting.rdp import (
        RDPRule,
        charge_rdp,
        gaussian_rdp,
        gaussian_zcdp,
        laplace_rdp,
        rdp_epsilon,
        sgm_epsilon,
        subsampled_gaussian_rdp,
        wor_subsampled_gaussian_rdp,
        zcdp_epsilon,
    )


#: Which module defines each public name; a name's module (and what it imports, such
#: as scipy.fft for the PLD engine) loads when the name is first used (PEP 562).
_WHERE = {
    "calibrate_dpsgd_noise": "dpsgd",
    "dpsgd_epsilon": "dpsgd",
    "dpsgd_epsilon_bounds": "dpsgd",
    "dpsgd_schedule": "dpsgd",
    "dpsgd_step_charge": "dpsgd",
    "GDPFilterRule": "gdp",
    "gdp_epsilon": "gdp",
    "PLDRule": "pld",
    "PrivacyLossDistribution": "pld",
    "compose_plan": "pld",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in __all__:
        raise AttributeError(f"module 'dpaccount.accounting' has no attribute {name!r}")
    module = importlib.import_module(f"dpaccount.accounting.{_WHERE.get(name, 'rdp')}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "GDPFilterRule",
    "PLDRule",
    "PrivacyLossDistribution",
    "RDPRule",
    "calibrate_dpsgd_noise",
    "charge_rdp",
    "compose_plan",
    "dpsgd_epsilon",
    "dpsgd_epsilon_bounds",
    "dpsgd_schedule",
    "dpsgd_step_charge",
    "gaussian_rdp",
    "gaussian_zcdp",
    "gdp_epsilon",
    "laplace_rdp",
    "rdp_epsilon",
    "sgm_epsilon",
    "subsampled_gaussian_rdp",
    "wor_subsampled_gaussian_rdp",
    "zcdp_epsilon",
]
