"""Tight accounting engines: privacy loss distributions (PLD) and Renyi DP (RDP).

| rule | proven for | theorem |
|---|---|---|
| ``pld`` | adaptive mechanisms, declared plan | Dong-Roth-Su 2019 Thm 3.2; Zhu-Dong-Wang 2022 |
| ``rdp`` | fully adaptive (Renyi filter) | Feldman-Zrnic 2021 Thm 3.1 |
| ``gdp`` | fully adaptive, plain Gaussians | Smith-Thakurta 2022 Thm 1.1 |
"""

from dpaccount.accounting.dpsgd import (
    calibrate_dpsgd_noise,
    dpsgd_epsilon,
    dpsgd_epsilon_bounds,
    dpsgd_schedule,
    dpsgd_step_charge,
)
from dpaccount.accounting.pld import PLDRule, PrivacyLossDistribution, compose_plan
from dpaccount.accounting.rdp import (
    GDPFilterRule,
    RDPRule,
    charge_rdp,
    gaussian_rdp,
    gaussian_zcdp,
    gdp_epsilon,
    laplace_rdp,
    rdp_epsilon,
    sgm_epsilon,
    subsampled_gaussian_rdp,
    wor_subsampled_gaussian_rdp,
    zcdp_epsilon,
)

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
