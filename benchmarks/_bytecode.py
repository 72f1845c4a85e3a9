"""Make dpaccount load from compiled bytecode, as an installed wheel does.

``pip install`` compiles a wheel's modules; an editable install under
``PYTHONDONTWRITEBYTECODE=1`` never writes them, so each fresh interpreter would compile
dpaccount from source while numpy, scipy and the anchors load their ``.pyc`` files. The
benchmarks that time first calls or imports call `compile_dpaccount` first.
"""

from __future__ import annotations

import os
import subprocess
import sys


def compile_dpaccount() -> None:
    """Write dpaccount's bytecode (``__pycache__``) next to its sources."""
    import dpaccount

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q",
                    os.path.dirname(dpaccount.__file__)], check=True, env=env)
