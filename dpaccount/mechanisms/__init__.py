"""Noise-adding mechanisms: each states its charge before it runs, then releases.

Noise comes from the OS CSPRNG by default (`RandomSource`); every sampler is
exact on the integers (discrete Laplace / Gaussian on a lattice, exact Bernoulli draws),
and every charge is the guarantee of the sampler actually used.
"""

from dpaccount.mechanisms._sampling import RandomSource
from dpaccount.mechanisms.base import Mechanism
from dpaccount.mechanisms.blr import BLRMechanism
from dpaccount.mechanisms.elliptical import EllipticalGaussianMechanism
from dpaccount.mechanisms.exponential import ExponentialMechanism
from dpaccount.mechanisms.gaussian import GaussianMechanism
from dpaccount.mechanisms.integer import IntegerGaussianMechanism, IntegerLaplaceMechanism
from dpaccount.mechanisms.laplace import LaplaceMechanism
from dpaccount.mechanisms.randomized_response import RandomizedResponseMechanism

__all__ = [
    "BLRMechanism",
    "EllipticalGaussianMechanism",
    "ExponentialMechanism",
    "GaussianMechanism",
    "IntegerGaussianMechanism",
    "IntegerLaplaceMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "RandomSource",
    "RandomizedResponseMechanism",
]
