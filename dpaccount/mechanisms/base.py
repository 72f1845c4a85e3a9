"""What every mechanism offers: its charge, known before it runs, and ``release``."""

from __future__ import annotations

import abc
from typing import Any

from dpaccount.charges import Charge

__all__ = ["Mechanism"]


class Mechanism(abc.ABC):
    """A noise-adding mechanism with fixed, validated parameters.

    ``charge`` is pure and known before any data is read: the accountant records it
    first, and only then is the query run and `release()` called on its answer.
    """

    @property
    @abc.abstractmethod
    def charge(self) -> Charge:
        """The privacy cost of one `release()`, as a charge for the accountant."""

    @abc.abstractmethod
    def release(self, value: Any) -> Any:
        """Return a noisy version of the query's true answer ``value``."""
