"""The composition plot and its numbers."""

from __future__ import annotations

import builtins
import math
from pathlib import Path
from typing import Any

import pytest

from dpaccount.plot import composition_curves, plot_composition


def test_curves_cross_over() -> None:
    # Basic composition wins for small k, the sqrt(k) rules for large k (the crossover
    # the seed notes show). For eps = 0.1, delta' = 1e-5 Thm 3.20 beats k eps once
    # sqrt(2k ln 1e5) + k (e^0.1 - 1) < k, i.e. k > 2 ln(1e5) / (2 - e^0.1)^2 = 28.6.
    crossover = 2 * math.log(1e5) / (2 - math.exp(0.1)) ** 2
    curves = composition_curves("0.1", 0, 200, "1e-5", points=200)
    for k, basic, adv, opt, filt in zip(
        curves["k"],
        curves["basic"],
        curves["advanced"],
        curves["optimal"],
        curves["filter"],
        strict=True,
    ):
        assert basic == pytest.approx(0.1 * k, rel=1e-12)
        assert opt <= basic * (1 + 1e-12)
        assert opt <= adv
        assert filt > 0
        if k < crossover - 1:
            assert basic < adv
        if k > crossover + 1:
            assert adv < basic


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = plot_composition("0.1", 0, 100, "1e-5", tmp_path / "c.png", points=20)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r'pip install "dpaccount\[plot\]"'):
        plot_composition("0.1", 0, 10, "1e-5", tmp_path / "c.png")
