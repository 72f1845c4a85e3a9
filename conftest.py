"""Collection rules for the whole tree: framework adapters need their framework.

`dpaccount.integrations.opacus`, `dpaccount.integrations.jax` and
`dpaccount.integrations.dp_events` import Opacus / JAX / dp_accounting when imported,
so their doctests are only collected where the framework is installed.
With ``DPACCOUNT_REQUIRE_ML=1`` (set by ``.ci/run``) nothing is skipped: a missing
framework fails the run instead.
"""

from __future__ import annotations

import importlib.util
import os

_ADAPTERS = {
    "dpaccount/integrations/opacus.py": "opacus",
    "dpaccount/integrations/jax.py": "jax",
    "dpaccount/integrations/dp_events.py": "dp_accounting",
}

collect_ignore = [
    path
    for path, module in _ADAPTERS.items()
    if os.environ.get("DPACCOUNT_REQUIRE_ML") != "1" and importlib.util.find_spec(module) is None
]
