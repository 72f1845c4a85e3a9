"""Discretised privacy loss distributions on a grid, composed with the FFT.

A `DiscretePLD` holds the P-probabilities of the privacy loss on the grid
``interval * (offset + i)``, a mass at +infinity, and a bound ``error`` on the l1 error
that floating point has put into ``probs`` (the FFT error of every convolution so far,
Higham 2002, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Thm 24.2).

Two kinds exist:

* *pessimistic* (``pessimistic=True``): its privacy profile is >= the mechanism's at
  every epsilon. Built by the "connect the dots" construction (Doroshenko, Ghazi, Kamath,
  Kumar and Manurangsi 2022): the profile is sampled at the grid
  points and linearly interpolated in the variable e^epsilon, which lies above the
  profile because the profile is convex in e^epsilon. Tails are truncated
  pessimistically: the upper tail goes to +infinity, the lower tail up to the first kept
  point (raising losses keeps domination; Meiser and Mohammadi 2018;
  Koskela, Jalko and Honkela 2020).
* *optimistic*: the output binned by its loss (post-processing, so dominated), each
  bin's loss rounded down to the grid; tails truncated downwards (upper tail moved to
  the last kept point, lower tail dropped, i.e. sent to loss -infinity). Composition is
  monotone in every loss value, so its hockey-stick divergence is a lower bound.

Composition of dominating pairs is dominated by the composition of the pairs (Zhu, Dong
and Wang 2022; for trade-off functions Dong, Roth and Su 2019, Thm 3.2), so the
composed pessimistic PLD bounds the composed mechanism.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import fft

from dpaccount.accounting.pld.pairs import Array, Pair, UpperPair

#: Block length factor of `decayed_suffix_sums`: within a block the weights stay in
#: [e^-30, 1], so no product of a mass and a weight underflows before 1e-295.
_BLOCK_LOG = 30.0


def decayed_suffix_sums(probs: Array, h: float) -> Array:
    """c[j] = sum_{i >= j} probs[i] e^{-(i - j) h}, for non-negative probs.

    The first-order recursion c[j] = probs[j] + e^-h c[j + 1], computed by blocks (no
    scipy.signal, whose import alone costs ~0.4 s): in a block [s, e),
    c[j] = e^{(j - s) h} sum_{i = j}^{e-1} probs[i] e^{-(i - s) h} + e^{-(e - j) h} c[e],
    with every weight in [e^-30, 1]. Each value is a sum of non-negative terms (a
    reverse cumulative sum, at most (m - 1) u relative for m terms) times factors
    computed by exp of an argument below 30 in magnitude (about 32 u relative), so it is
    within (m + 40) u of its value, plus at most 1e-295 per term from underflow.
    """
    n = probs.size
    out = np.empty(n, dtype=np.float64)
    block = max(1, int(_BLOCK_LOG / h))
    carry = 0.0
    end = n
    while end > 0:
        start = max(0, end - block)
        steps = np.arange(end - start, dtype=np.float64)
        offsets = steps * h
        weighted = probs[start:end] * np.exp(-offsets)
        within = np.cumsum(weighted[::-1])[::-1] * np.exp(offsets)
        out[start:end] = within + carry * np.exp(-(end - start - steps) * h)
        carry = float(out[start])
        end = start
    return out

__all__ = ["DiscretePLD", "from_pair", "upper_from_profile"]

_U = 2.0**-53
#: Constant of the FFT error bound (Higham 2002, Thm 24.2 gives ~ log2(N) * 5u per
#: transform for a radix-2 FFT with accurate twiddles); we take twice that margin.
_FFT_C = 10.0
#: Relative margin for the library's normal CDF and exp/log (a few ulps; taken wide).
_PROFILE_SLACK = 1e-12


class DiscretePLD:
    """A privacy loss distribution on a grid (see the module docstring).

    Attributes:
        interval: Grid spacing of the loss values.
        offset: The loss of ``probs[0]`` is ``offset * interval``.
        probs: Non-negative masses.
        infinity_mass: Mass at loss +infinity.
        error: A bound on the l1 distance between ``probs`` and the exact masses.
        pessimistic: Which side this discretisation bounds.
    """

    __slots__ = ("error", "infinity_mass", "interval", "offset", "pessimistic", "probs")

    def __init__(
        self,
        interval: float,
        offset: int,
        probs: Array,
        infinity_mass: float,
        error: float,
        pessimistic: bool,
    ) -> None:
        self.interval = interval
        self.offset = offset
        self.probs = probs
        self.infinity_mass = infinity_mass
        self.error = error
        self.pessimistic = pessimistic

    # -- composition -------------------------------------------------------------

    def compose(self, other: DiscretePLD, tail_mass: float) -> DiscretePLD:
        """The PLD of the composition (the convolution of the two), tails truncated."""
        if other.interval != self.interval or other.pessimistic != self.pessimistic:
            raise ValueError("PLDs on different grids or of different kinds")
        a, b = self.probs, other.probs
        n = a.size + b.size - 1
        size = fft.next_fast_len(n, real=True)
        conv = fft.irfft(fft.rfft(a, size) * fft.rfft(b, size), size)[:n]
        mass_a, mass_b = float(a.sum()), float(b.sum())
        l2 = float(np.linalg.norm(a)) * mass_b + float(np.linalg.norm(b)) * mass_a
        fft_error = (
            math.sqrt(size) * _FFT_C * math.log2(max(size, 2)) * _U
            * (2 * l2 + float(np.linalg.norm(conv)))
        )
        error = (
            self.error * (mass_b + other.error)
            + other.error * (mass_a + self.error)
            + fft_error
        )
        np.maximum(conv, 0.0, out=conv)
        inf_a, inf_b = self.infinity_mass, other.infinity_mass
        infinity = inf_a + inf_b - inf_a * inf_b
        if self.pessimistic:
            infinity = math.nextafter(infinity, 1.0)
        result = DiscretePLD(
            self.interval, self.offset + other.offset, conv, infinity, error, self.pessimistic
        )
        return result.truncate(tail_mass)

    def self_compose(self, count: int, tail_mass: float) -> DiscretePLD:
        """``count``-fold composition.

        One FFT raised to the power ``count`` on a window chosen by a Chernoff bound
        (what falls outside is bounded and accounted for), or, when that window would
        not help, repeated squaring (O(log count) convolutions).
        """
        if count < 1:
            raise ValueError("count must be >= 1")
        if count >= 4:
            powered = self._power(count, tail_mass)
            if powered is not None:
                return powered
        return self._squaring(count, tail_mass)

    def _window(self, count: int, tail_mass: float) -> tuple[int, int]:
        """Index window [lo, hi] of the count-fold sum outside which each tail has
        mass <= tail_mass, by the Chernoff bound mu(S >= t) <= e^{-lt} M(l)^count."""
        p = self.probs
        n = p.size
        idx = np.arange(n, dtype=np.float64)
        log_tail = math.log(tail_mass)
        hi = float(count * (n - 1))
        lo = 0.0
        positive = p > 0
        log_w, where = np.log(p[positive]), idx[positive]
        lambdas = np.geomspace(1e-9, 10.0, 40)
        chunk = max(1, 2_000_000 // max(where.size, 1))
        for start in range(0, lambdas.size, chunk):
            lam = lambdas[start : start + chunk, None]
            for sign in (1.0, -1.0):
                exponent = sign * lam * where[None, :] + log_w[None, :]
                peak = exponent.max(axis=1)
                log_m = peak + np.log(np.exp(exponent - peak[:, None]).sum(axis=1))
                bounds = (count * log_m - log_tail) / (sign * lam[:, 0])
                if sign > 0:
                    hi = min(hi, float(bounds.min()))
                else:
                    lo = max(lo, float(bounds.max()))
        return max(0, math.floor(lo)), min(count * (n - 1), math.ceil(hi))

    def _power(self, count: int, tail_mass: float) -> DiscretePLD | None:
        p = self.probs
        lo, hi = self._window(count, tail_mass)
        if hi < lo:
            return None
        width = hi - lo + 1
        size = fft.next_fast_len(max(width, p.size), real=True)
        base_spectrum = fft.rfft(p, size)
        spectrum = base_spectrum**count
        raw = fft.irfft(spectrum, size)
        probs = np.roll(raw, -(lo % size))[:width].copy()
        mass = float(p.sum())
        growth = max(mass, 1.0) ** (count - 1)
        log_n = math.log2(max(size, 2))
        # Componentwise FFT error of each coefficient: <= C log2(N) u sum|p| (Higham
        # 2002, Thm 24.2, applied per output); it is amplified by count |A|^(count-1)
        # at each frequency, and the power itself costs a relative count C u. Sums run
        # over both halves of the spectrum (factor 2 covers the conjugate half).
        coeff_error = _FFT_C * log_n * _U * mass
        modulus = np.abs(base_spectrum) + coeff_error
        with np.errstate(divide="ignore", under="ignore"):
            log_mod = np.log(modulus)
        sum_km1 = 2 * float(np.sum(np.exp(np.minimum(2 * (count - 1) * log_mod, 700.0))))
        sum_k = 2 * float(np.sum(np.exp(np.minimum(2 * count * log_mod, 700.0))))
        spectral = (
            count * coeff_error * math.sqrt(sum_km1) + count * _FFT_C * _U * math.sqrt(sum_k)
        )
        l2 = spectral / math.sqrt(size) + _FFT_C * log_n * _U * float(np.linalg.norm(raw))
        error = count * growth * self.error + math.sqrt(size) * l2
        cut_low = tail_mass if lo > 0 else 0.0
        cut_high = tail_mass if hi < count * (p.size - 1) else 0.0
        error += 2 * cut_low + cut_high if self.pessimistic else cut_low + cut_high
        np.maximum(probs, 0.0, out=probs)
        infinity = 0.0
        if self.infinity_mass:
            infinity = -math.expm1(count * math.log1p(-self.infinity_mass))
        if self.pessimistic:
            infinity = math.nextafter(min(1.0, infinity * (1 + 1e-12) + cut_high), 1.0)
        result = DiscretePLD(
            self.interval, count * self.offset + lo, probs, infinity, error, self.pessimistic
        )
        return result.truncate(tail_mass)

    def _squaring(self, count: int, tail_mass: float) -> DiscretePLD:
        result: DiscretePLD | None = None
        base: DiscretePLD = self
        while True:
            if count & 1:
                result = base if result is None else result.compose(base, tail_mass)
            count >>= 1
            if not count:
                break
            base = base.compose(base, tail_mass)
        if result is None:  # pragma: no cover - count >= 1 always sets it
            raise ValueError("count must be >= 1")
        return result

    def truncate(self, tail_mass: float) -> DiscretePLD:
        """Drop tails of at most ``tail_mass`` each, on the side this PLD bounds."""
        p = self.probs
        if p.size <= 2 or tail_mass <= 0:
            return self
        low_cum = np.cumsum(p)
        high_cum = np.cumsum(p[::-1])
        lo = int(np.searchsorted(low_cum, tail_mass, side="right"))
        hi = p.size - int(np.searchsorted(high_cum, tail_mass, side="right"))
        if lo >= hi:
            return self
        low_mass = float(low_cum[lo - 1]) if lo > 0 else 0.0
        high_mass = float(high_cum[p.size - hi - 1]) if hi < p.size else 0.0
        kept = p[lo:hi].copy()
        infinity = self.infinity_mass
        if self.pessimistic:
            kept[0] += low_mass
            infinity = math.nextafter(infinity + high_mass, 1.0) if high_mass else infinity
        else:
            kept[-1] += high_mass
        return DiscretePLD(
            self.interval, self.offset + lo, kept, infinity, self.error, self.pessimistic
        )

    # -- reading the privacy profile --------------------------------------------

    def _losses(self) -> Array:
        index = np.arange(self.offset, self.offset + self.probs.size, dtype=np.float64)
        return index * self.interval

    def _slack(self) -> float:
        """What floating point may have cost in ``epsilon``'s grid search: the l1 error
        plus a summation error relative to the total mass (a coarse first pass; every
        pessimistic answer is then verified with `delta()`'s relative bound)."""
        return self.error + 4 * self.probs.size * _U * float(self.probs.sum())

    def delta(self, epsilon: float) -> float:
        """delta(epsilon) of this PLD, pushed to its side by the error bound.

        For a pessimistic PLD the result is >= the exact hockey-stick divergence of the
        exact discretised PLD; for an optimistic one it is <= it. The sum has only
        non-negative terms, each accurate to a few ulps, and numpy sums pairwise, so its
        rounding error is at most (log2(m) + 4) u times the sum itself (Higham 2002,
        Sec. 4.2); twice that is allowed, plus the l1 error ``error`` of the
        probabilities (zero before any FFT). The allowance is relative to the value, so
        tiny deltas (1e-12 and below) keep their precision.
        """
        losses = self._losses()
        above = losses > epsilon
        terms = self.probs[above] * -np.expm1(epsilon - losses[above])
        total = float(terms.sum())
        rounding = 2 * (math.log2(max(terms.size, 2)) + 4) * _U * total
        value = total + self.infinity_mass
        if self.pessimistic:
            return min(1.0, value + rounding + self.error)
        return max(0.0, value - rounding - self.error)

    def epsilon(self, delta: float) -> float:
        """The smallest epsilon whose pushed delta(epsilon) is <= ``delta``.

        Returns ``math.inf`` if no epsilon reaches ``delta`` (the mass at infinity is too
        large). For a pessimistic PLD, the exact profile is <= ``delta`` at the result;
        for an optimistic one, the exact profile is >= ``delta`` just below it.
        """
        if delta <= 0 and self.pessimistic:
            # Pure DP: the array bounds the support (float error only moves mass within
            # it), so its largest loss is a certified epsilon(0) when nothing is at +inf.
            if self.infinity_mass > 0:
                return math.inf
            top = self.offset + self.probs.size - 1
            return max(top * self.interval, 0.0)
        slack = self._slack()
        if self.pessimistic and delta - slack - self.infinity_mass <= 0:
            # The coarse allowance swamps a tiny delta: search with delta's own relative
            # bound instead (exact search on the verified profile).
            return self._epsilon_by_bisection(delta)
        target = delta - slack if self.pessimistic else delta + slack
        target -= self.infinity_mass
        if target <= 0:
            return math.inf if self.pessimistic else 0.0
        p = self.probs
        h = self.interval
        decay = math.exp(-h)
        # c[j] = sum_{i >= j} p_i e^{(j - i) h};  tail[j] = sum_{i >= j} p_i.
        c = decayed_suffix_sums(p, h)
        tail = np.cumsum(p[::-1])[::-1]
        # delta at loss l_j is sum_{i > j} p_i (1 - e^{l_j - l_i}).
        tail_next = np.append(tail[1:], 0.0)
        c_next = np.append(c[1:], 0.0)
        grid_delta = tail_next - decay * c_next
        ok = np.nonzero(grid_delta <= target)[0]
        if ok.size == 0:
            return math.inf if self.pessimistic else 0.0
        j = int(ok[0])
        losses_j = (self.offset + j) * h
        # On (l_{j-1}, l_j]: delta(e) = tail[j] - e^{e - l_j} c[j]; solve delta(e) = target.
        numerator = float(tail[j]) - target
        if numerator <= 0 or c[j] <= 0:
            candidate = losses_j - h if j > 0 else -math.inf
        else:
            candidate = losses_j + math.log(numerator / float(c[j]))
            low = losses_j - h if j > 0 else -math.inf
            candidate = min(max(candidate, low), losses_j)
        if self.pessimistic:
            candidate = math.nextafter(math.nextafter(candidate, math.inf), math.inf)
            candidate += 1e-12 * max(1.0, abs(candidate))
            # Verify directly (each term accurate to a few ulps) and fall back to the
            # grid point, whose check above already passed.
            if not self.delta(candidate) <= delta:
                candidate = losses_j
                while self.delta(candidate) > delta:
                    candidate += h
            return max(candidate, 0.0)
        candidate -= 1e-12 * max(1.0, abs(candidate))
        return max(candidate, 0.0)

    def _epsilon_by_bisection(self, delta: float) -> float:
        """The smallest grid-or-between epsilon with the verified ``delta(eps) <= delta``.

        `delta()` is non-increasing in epsilon and carries its own (relative)
        rounding allowance, so bisection on it gives a certified answer; ``inf`` if
        even the largest loss does not reach ``delta``.
        """
        top = (self.offset + self.probs.size - 1) * self.interval
        if self.delta(top) > delta:
            return math.inf
        low = self.offset * self.interval - self.interval
        if self.delta(low) <= delta:
            return max(low, 0.0)
        high = top
        for _ in range(200):
            mid = (low + high) / 2
            if mid <= low or mid >= high:
                break
            if self.delta(mid) <= delta:
                high = mid
            else:
                low = mid
        return max(high, 0.0)


def _suffix_sums(probs: Array) -> tuple[Array, Array]:
    """sum_{i >= j} probs[i] for every j, with a rigorous bound on each one's error.

    Two-level blocked summation in extended precision (numpy's longdouble; where that
    is just a double the bound says so): each value is a within-block suffix sum (at
    most B terms) plus a suffix sum of block totals (at most n / B terms), so its error
    is at most (B + n / B + 2) u_ext times the sum of non-negative terms (Higham 2002,
    Sec. 4.2), about 2 sqrt(n) u_ext: small even next to a delta of 1e-12 at the low end
    of a long grid, where plain cumulative sums would carry n u.
    """
    n = probs.size
    block = max(1, math.isqrt(n))
    blocks = -(-n // block)
    padded = np.zeros(blocks * block, dtype=np.longdouble)
    padded[:n] = probs[::-1]
    grid = padded.reshape(blocks, block)
    within = np.cumsum(grid, axis=1)
    before = np.concatenate(([0.0], np.cumsum(within[:, -1])[:-1])).astype(np.longdouble)
    suffix = (within + before[:, None]).reshape(-1)[:n][::-1]
    unit = float(np.finfo(np.longdouble).eps) / 2
    rounded = np.asarray(suffix, dtype=np.float64)
    # ... plus the final rounding to a double (half an ulp of the result).
    error = ((block + blocks + 2) * unit + _U) * rounded * (1 + 1e-6)
    return rounded, error


def _grid(low: float, high: float, interval: float) -> tuple[int, int]:
    return math.floor(low / interval), math.ceil(high / interval)


def from_pair(pair: Pair, interval: float, tail_mass: float, pessimistic: bool) -> DiscretePLD:
    """Discretise a dominating pair on the grid of spacing ``interval``.

    Args:
        pair: The pair, through its profile and loss survival function.
        interval: The grid spacing (``value_discretization_interval``).
        tail_mass: How much P-mass may be left outside the grid on each side.
        pessimistic: Connect-the-dots upper discretisation, or floor-rounded lower one.
    """
    if pessimistic:
        return upper_from_profile(pair, interval, tail_mass)
    i_lo, eps = _loss_grid(pair, interval, tail_mass)
    return _binned(pair, i_lo, eps.size, interval)


def upper_from_profile(pair: UpperPair, interval: float, tail_mass: float) -> DiscretePLD:
    """The pessimistic (connect-the-dots) discretisation, which needs only a profile.

    Its privacy profile is at least the pair's at every epsilon whatever the grid's
    range (above the grid the last value becomes mass at +inf; below it the profile is
    interpolated from delta = 1 at e^eps = 0), so ``tail_mass`` only sets the range.
    """
    i_lo, eps = _loss_grid(pair, interval, tail_mass)
    return _connect_dots(pair, eps, i_lo, interval)


def _loss_grid(pair: UpperPair, interval: float, tail_mass: float) -> tuple[int, Array]:
    low, high = pair.loss_range(tail_mass)
    i_lo, i_hi = _grid(low, high, interval)
    if i_hi <= i_lo:
        i_hi = i_lo + 1
    return i_lo, np.arange(i_lo, i_hi + 1, dtype=np.float64) * interval


#: A loss within this fraction of a grid step below a grid point counts as on it (so
#: atoms that sit exactly on the grid, as in the Laplace and (epsilon, delta) pairs, are
#: not pushed a whole step down by rounding noise). The lower bound is therefore a
#: lower bound up to a shift of 1e-7 grid steps per composition.
_ATOM_TOLERANCE = 1e-7

#: Candidate bin offsets (grid units above the midpoint below each grid point), tried
#: in turn for the bins whose loss would otherwise round down a whole step.
_BIN_OFFSETS = (0.003, 0.03, 0.2, 0.5 + 1e-3)


def _binned(pair: Pair, i_lo: int, size: int, interval: float) -> DiscretePLD:
    """The optimistic discretisation: bin the output, then round each loss down.

    Bin j collects the outputs whose loss lies in [e_j, e_{j+1}), with e_j a little
    above the midpoint (i_lo + j - 1/2) h. Replacing outputs by their bin is
    post-processing, so the binned pair is dominated by the true one; its loss on bin
    j is r_j = ln(P(I_j) / Q(I_j)), which lies in [e_j, e_{j+1}], and is rounded down
    to the grid (losses only go down, so the result is a lower bound; Meiser and
    Mohammadi 2018, Sec. 5, round down without binning). Each bin's lower edge is
    raised through `_BIN_OFFSETS` until r_j is at or above its grid point (raising
    an edge only raises the neighbouring bin's loss), so most mass loses about
    0.003 h instead of h / 2. Q(L > t) = e^{-t} (P(L > t) - delta(t)).
    """
    grid = np.arange(i_lo, i_lo + size + 1, dtype=np.float64)
    offsets = np.full(size + 1, _BIN_OFFSETS[0])
    for attempt, _offset in enumerate(_BIN_OFFSETS):
        edges = (grid - 0.5 + offsets) * interval
        p_tail = pair.sf(edges)
        q_tail = np.exp(-edges) * np.maximum(p_tail - pair.profile(edges), 0.0)
        p_bins = np.maximum(p_tail - np.append(p_tail[1:], 0.0), 0.0)
        q_bins = np.maximum(q_tail - np.append(q_tail[1:], 0.0), 0.0)
        upper_edges = np.append(edges[1:], np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            loss = np.log(p_bins) - np.log(q_bins)
        loss = np.where(np.isfinite(loss), loss, edges)
        loss = np.clip(loss, edges, upper_edges)
        index = np.floor(loss / interval + _ATOM_TOLERANCE).astype(np.int64) - i_lo
        short = (index < np.arange(size + 1)) & (p_bins > 0)
        if attempt + 1 == len(_BIN_OFFSETS) or not short.any():
            break
        offsets = np.where(short, _BIN_OFFSETS[attempt + 1], offsets)
    index = np.clip(index, 0, size - 1)
    probs = np.bincount(index, weights=p_bins, minlength=size).astype(np.float64)
    probs *= 1 - _PROFILE_SLACK
    error = 4 * probs.size * _U
    return DiscretePLD(interval, i_lo, probs, pair.infinity_mass, error, False)


def _connect_dots(pair: UpperPair, eps: Array, i_lo: int, interval: float) -> DiscretePLD:
    """The connect-the-dots construction (Doroshenko et al. 2022), overflow-free.

    With delta_i the profile at eps_i and x_i = e^{eps_i}, the interpolating profile has
    slope s_i = (delta_{i+1} - delta_i) / (x_{i+1} - x_i) on [x_i, x_{i+1}], slope
    (delta_0 - 1) / x_0 before x_0 (it passes through delta = 1 at x = 0), slope 0 after
    the last point, and mass p_i = x_i (s_i - s_{i-1}) at eps_i; delta_n goes to +inf.

    Floating point: the profile is pushed up by a *relative* margin before the masses
    are built, large enough to cover the rounding of the build (checked a posteriori
    against a rigorous bound, see `_shortfall()`). A margin relative to the profile
    keeps deltas of 1e-12 and below accurate, where an absolute allowance of the size of
    the whole mass's rounding would swamp them.
    """
    true = np.maximum(pair.profile(eps.astype(np.float64)), 0.0)
    margin = _PROFILE_SLACK
    for _attempt in range(4):
        pld = _connect_dots_once(true, margin, i_lo, interval)
        shortfall, needed = _shortfall(pld, true)
        if shortfall <= 0:
            return pld
        margin = 2 * (margin + needed)
    # Not covered by a relative margin (cannot happen for a convex profile; kept as a
    # sound fallback): raise the whole profile by the shortfall.
    pld.infinity_mass = min(1.0, pld.infinity_mass + 2 * shortfall)
    return pld


def _connect_dots_once(true: Array, margin: float, i_lo: int, interval: float) -> DiscretePLD:
    deltas = np.minimum(np.where(true > 0, true * (1 + margin) + 1e-300, 0.0), 1.0)
    # The profile is non-increasing; enforce it against rounding noise (upward).
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    em1 = math.expm1(interval)
    e = math.exp(interval)
    diffs = np.diff(deltas)  # delta_{i+1} - delta_i  (<= 0)
    forward = np.append(diffs, 0.0) / em1  # x_i s_i
    backward = np.empty_like(deltas)
    backward[0] = deltas[0] - 1.0  # x_0 s_{-1}
    backward[1:] = e * diffs / em1  # x_i s_{i-1} = e^h x_{i-1} s_{i-1}
    probs = np.maximum(forward - backward, 0.0)
    return DiscretePLD(interval, i_lo, probs, float(deltas[-1]), 0.0, True)


def _shortfall(pld: DiscretePLD, true: Array) -> tuple[float, float]:
    """How far the built profile may be below the true one, absolute and relative.

    The built profile at grid point j is sum_{i > j} p_i (1 - e^{(j - i) h}) + the mass
    at infinity, computed here as tail - e^{-h} c from running sums of non-negative
    terms taken from the top (numpy's cumsum and a first-order recursion): each is
    within 4 (m + 4) u of its own value for m terms (Higham 2002, Sec. 4.2, recursive
    summation), so the exact built profile is at least the computed one minus
    ``rounding``. It must be at least the true profile pushed by the library's own
    error, ``true (1 + _PROFILE_SLACK)``, wherever the true profile is positive.
    """
    probs, h = pld.probs, pld.interval
    decay = math.exp(-h)
    c = decayed_suffix_sums(probs, h)
    tail, tail_error = _suffix_sums(probs)
    tail_next, c_next = np.append(tail[1:], 0.0), np.append(c[1:], 0.0)
    terms = np.arange(probs.size, 0, -1, dtype=np.float64)  # values in each sum
    # c: sums of non-negative terms, within (m + 40) u of itself plus 1e-295 a term
    # (`decayed_suffix_sums`); twice that is allowed.
    rounding = (
        np.append(tail_error[1:], 0.0) + 2 * (terms + 40) * _U * c_next + terms * 2e-295
    )
    rounding = rounding * 2 + 4 * _U * tail_next  # the subtraction, and a margin
    built = np.maximum(tail_next - decay * c_next - rounding, 0.0) + pld.infinity_mass
    positive = true > 0
    gap = np.where(positive, true * (1 + _PROFILE_SLACK) - built, 0.0)
    if not positive.any():
        return 0.0, 0.0
    relative = float(np.max(gap[positive] / true[positive]))
    return float(np.max(gap)), max(relative, 0.0)
