"""Exact and directed-rounding arithmetic for privacy parameters.

Budgets and charges are exact rationals (`fractions.Fraction`). A float is taken
at its exact binary value (``0.1`` is ``3602879701896397/36028797018963968``, slightly
above one tenth); a ``str``, `Decimal` or `Fraction` at
its exact decimal or rational value.

Bounds that need transcendental functions are evaluated in floating point and then
rounded *up* by a few units in the last place (`up()`), which covers the error of
the C library's ``exp``/``log``/``sqrt`` (correctly rounded or within one ulp on every
platform CPython supports) with margin. Functions that must round toward *less* (for
example an inverse that gives a per-query budget) use `down()`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable
from decimal import Decimal
from fractions import Fraction
from typing import Any, Final

from scipy import special

from dpaccount.errors import InvalidCostError

__all__ = [
    "ONE",
    "SUM_BITS",
    "ZERO",
    "bounded_up",
    "check_count",
    "check_delta",
    "check_epsilon",
    "check_positive",
    "check_rate",
    "down",
    "exp_up",
    "fits_grid",
    "float_down",
    "float_up",
    "gaussian_delta_up",
    "laplace_epsilon_up",
    "log1p_expm1_scaled_up",
    "log_up",
    "sqrt_up",
    "to_fraction",
    "up",
]

ZERO = Fraction(0)
ONE = Fraction(1)

#: How many ulps a floating-point result is pushed in the safe direction. libm's exp,
#: log, sqrt, expm1, log1p are within 1 ulp; one elementary operation on top adds at most
#: half an ulp each. Callers chaining several operations pass a larger ``ulps``.
_DEFAULT_ULPS = 4


#: The largest numerator or denominator (in bits) of a privacy parameter given by a user.
#: Every double fits (its exact binary value needs at most 1075 bits), and so does any
#: decimal of a few hundred digits; larger values are refused before they are built, so
#: no input can hang the process or make a stored sum unprintable.
MAX_VALUE_BITS = 4096
#: Decimal exponents and digit counts allowed in a string or Decimal (10^1200 < 2^4096).
MAX_DECIMAL_DIGITS = 1200

_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?")
_RATIO_TEXT = re.compile(r"[+-]?[0-9]+/[0-9]+")


def at_most(a: Fraction, b: Fraction) -> bool:
    """``a <= b`` for Fractions, by cross-multiplying their (positive-denominator) integer
    parts: the same answer as ``<=`` without its type dispatch, for per-charge paths.

    Examples:
        >>> at_most(Fraction(1, 3), Fraction(1, 3)), at_most(Fraction(2, 5), Fraction(1, 3))
        (True, False)
    """
    return a.numerator * b.denominator <= b.numerator * a.denominator


#: The grid of every exact running sum that can grow without bound (a rule's sums of
#: distinct run-time parameters, a SQL store's cached tip): a sum whose reduced
#: denominator needs more bits than this is rounded **up** to a multiple of
#: ``2**-SUM_BITS``. Sums of floats (denominators up to 2**1074, their squares 2**2148)
#: and of decimals within the cost bounds never reach it, so they stay exact; sums of
#: values with pairwise coprime denominators (``1/sigma**2`` for distinct float sigmas,
#: ``1/(10**100 + k)``) would otherwise grow without bound and make every charge slower.
SUM_BITS: Final = 4096


def bounded_up(value: Fraction) -> Fraction:
    """``value`` if its reduced denominator fits in `SUM_BITS` bits, else the next multiple
    of ``2**-SUM_BITS`` above it: never below ``value``, and above it by less than
    ``2**-SUM_BITS``. The one rounding of every bounded sum (rules and SQL stores;
    PostgreSQL's append function does the same in ``numeric``), so a sum of n terms is an
    upper bound on the exact sum, within n * 2**-SUM_BITS of it, and costs O(1) per term.

    Examples:
        >>> bounded_up(Fraction(1, 3))
        Fraction(1, 3)
        >>> big = Fraction(1, 3**3000)
        >>> 0 < bounded_up(big) - big < Fraction(1, 2**4096)
        True
        >>> bounded_up(big).denominator == 2**4096
        True
    """
    denominator = value.denominator
    if denominator.bit_length() <= SUM_BITS:
        return value
    # ceil(value * 2**SUM_BITS), dividing by the odd part of the denominator only (a sum
    # on the grid plus a fresh term has a small odd part: a short division)
    twos = (denominator & -denominator).bit_length() - 1
    odd = denominator >> twos
    if twos <= SUM_BITS:
        grid = -((-value.numerator << (SUM_BITS - twos)) // odd)
    else:
        grid = -((-value.numerator) // (odd << (twos - SUM_BITS)))
    if grid == 0:
        return ZERO
    # reduced without a gcd: the denominator is a power of two
    zeros = min((grid & -grid).bit_length() - 1, SUM_BITS)
    return _coprime(grid >> zeros, 1 << (SUM_BITS - zeros))


def _coprime(numerator: int, denominator: int) -> Fraction:
    """``Fraction(numerator, denominator)`` for coprime arguments, denominator > 0,
    without the gcd the constructor would compute (``Fraction._from_coprime_ints`` of
    Python 3.12, which 3.11 lacks)."""
    value = object.__new__(Fraction)
    object.__setattr__(value, "_numerator", numerator)
    object.__setattr__(value, "_denominator", denominator)
    return value


def fits_grid(denominators: Iterable[int]) -> bool:
    """Whether every sum of terms with these denominators (any multiplicities, any order)
    stays exact under `bounded_up`: their least common multiple fits in `SUM_BITS` bits
    (every such sum's reduced denominator divides it). Stops at the first that does not.

    Examples:
        >>> fits_grid([2**1074, 10**300, 3]), fits_grid([2**4096, 3])
        (True, False)
    """
    common = 1
    for denominator in denominators:
        if common % denominator:
            common = math.lcm(common, denominator)
            if common.bit_length() > SUM_BITS:
                return False
    return True


def int_text(value: int) -> str:
    """Decimal digits of an integer of any size (Python's int-to-str limit does not apply:
    a ledger's exact sums may grow past 4300 digits and must stay writable and readable)."""
    if value.bit_length() < 10_000:
        return str(value)
    return str(Decimal(value))


def text_int(text: str) -> int:
    """The integer written by `int_text` (digits, optional sign), of any size.

    Raises:
        ValueError: The text is not an integer.
    """
    if len(text) < 3_000:
        return int(text)
    if not text.lstrip("-").isdigit() or not text.isascii():
        raise ValueError("not an integer")
    return int(Decimal(text))


def _refuse(field: str, value: Any, reason: str) -> InvalidCostError:
    return InvalidCostError(field, value, reason)


def _bounded(result: Fraction, field: str, value: Any) -> Fraction:
    if (result.numerator.bit_length() > MAX_VALUE_BITS
            or result.denominator.bit_length() > MAX_VALUE_BITS):
        raise _refuse(field, value, f"needs more than {MAX_VALUE_BITS} bits to hold exactly; "
                      "use a value a double or a short decimal can express")
    return result


def _from_decimal(dec: Decimal, field: str, value: Any) -> Fraction:
    if not dec.is_finite():
        raise _refuse(field, value, "must be a finite number")
    _sign, digits, exponent = dec.as_tuple()
    if not isinstance(exponent, int) or abs(exponent) > MAX_DECIMAL_DIGITS or (
        len(digits) > MAX_DECIMAL_DIGITS
    ):
        raise _refuse(field, value, f"has more than {MAX_DECIMAL_DIGITS} digits or a decimal "
                      f"exponent beyond +-{MAX_DECIMAL_DIGITS}")
    return _bounded(Fraction(dec), field, value)


def _from_text(text: str, field: str, value: Any) -> Fraction:
    if len(text) > 2 * MAX_DECIMAL_DIGITS + 10:
        raise _refuse(field, value, "is too long to be a privacy parameter")
    decimal_form = _DECIMAL_TEXT.fullmatch(text)
    if decimal_form is not None:
        exponent = decimal_form.group(1)
        if exponent is not None and len(exponent.lstrip("+-").lstrip("0")) > 5:
            raise _refuse(field, value, f"has a decimal exponent beyond +-{MAX_DECIMAL_DIGITS}")
        return _from_decimal(Decimal(text), field, value)
    if _RATIO_TEXT.fullmatch(text) is not None:
        numerator, denominator = text.split("/")
        if int(denominator) == 0:
            raise _refuse(field, value, "has a zero denominator")
        return _bounded(Fraction(int(numerator), int(denominator)), field, value)
    raise _refuse(
        field,
        value,
        "is not a number: use plain ASCII digits, as a decimal like '0.1' or '1e-6' or a "
        "ratio like '1/10' (no spaces, underscores or other digits)",
    )


def _real_as_float(value: Any) -> float | None:
    """float(value) for a numbers.Real, or None if its conversion raises (never raises)."""
    try:
        result = float(value)
    except Exception:  # a hostile __float__ may raise anything
        return None
    return result if type(result) is float else None


def to_fraction(value: Any, field: str) -> Fraction:
    """Convert a user-given number to an exact `Fraction`.

    Subclasses of ``int``, ``float``, ``Fraction`` and ``Decimal`` are read through the
    base type's own data (an overridden ``__eq__`` or ``numerator`` cannot change the
    value), and strings must be plain ASCII decimals or ratios. Text, Decimals and
    integers whose exact form would need more than `MAX_VALUE_BITS` bits are refused
    before they are built (a ``Fraction`` is taken as it is: the library's own exact
    sums and remainders are Fractions of any size).

    Args:
        value: An int, float, str, Decimal, Fraction, or numpy scalar.
        field: The parameter's name, for the error message.

    Returns:
        The exact value. Floats keep their binary value; strings their decimal value.

    Raises:
        InvalidCostError: For bool, NaN, infinities, non-numeric or oversized strings,
            oversized values and other types.

    Examples:
        >>> to_fraction("0.1", "epsilon")
        Fraction(1, 10)
        >>> to_fraction(0.5, "epsilon")
        Fraction(1, 2)
        >>> to_fraction("1e-999999999", "epsilon")
        Traceback (most recent call last):
        ...
        dpaccount.errors.InvalidCostError: invalid epsilon='1e-999999999': has a decimal ...
    """
    kind = type(value)
    if isinstance(value, bool) or kind.__name__ == "bool_":
        raise _refuse(field, value, "a boolean is not a privacy parameter")
    if kind is Fraction:
        # Exact values computed inside the library (sums, remainders) are Fractions of
        # any size; only text, Decimals and integers, which a user types, are bounded.
        exact: Fraction = value
        return exact
    if isinstance(value, Fraction):  # a subclass: read the two integers underneath
        numerator = int.__int__(Fraction.numerator.__get__(value))
        denominator = int.__int__(Fraction.denominator.__get__(value))
        return Fraction(numerator, denominator)
    if isinstance(value, int):
        return _bounded(Fraction(int.__int__(value)), field, value)
    if isinstance(value, float):
        number = float.__float__(value)
        if not math.isfinite(number):
            raise _refuse(field, value, "must be a finite number")
        return Fraction(number)
    if isinstance(value, Decimal):
        return _from_decimal(Decimal(Decimal.__str__(value)), field, value)
    if isinstance(value, str):
        return _from_text(str.__str__(value), field, value)
    if isinstance(value, numbers.Integral):
        as_int = _real_as_float(value)
        if as_int is None:
            raise _refuse(field, value, "could not be converted to a number")
        return _bounded(Fraction(int(value)), field, value)
    if isinstance(value, numbers.Real):
        as_float = _real_as_float(value)
        if as_float is None:
            raise _refuse(field, value, "could not be converted to a number")
        if not math.isfinite(as_float):
            raise _refuse(field, value, "must be a finite number")
        return Fraction(as_float)
    raise _refuse(field, value, f"expected a real number, got {type(value).__name__}")


def check_epsilon(value: Any, field: str = "epsilon") -> Fraction:
    """Validate a non-negative finite epsilon and return it exactly."""
    result = to_fraction(value, field)
    if result < 0:
        raise InvalidCostError(field, value, "must be >= 0")
    return result


def check_delta(value: Any, field: str = "delta") -> Fraction:
    """Validate a delta in [0, 1) and return it exactly."""
    result = to_fraction(value, field)
    if result < 0 or result >= 1:
        raise InvalidCostError(field, value, "must be in [0, 1)")
    return result


#: The smallest positive delta the floating-point bounds (Renyi DP, Gaussian-DP, the
#: Gaussian's calibration, DP-SGD) accept. Below it a double cannot hold delta (or its
#: square), and no practical guarantee changes: such deltas are refused with a typed
#: error rather than overflowing. Exact rules (basic, optimal) and the log(1/delta)
#: bounds (advanced, heterogeneous, the filter) take any delta.
MIN_FLOAT_DELTA = Fraction(1, 10**300)


def check_float_delta(value: Fraction, field: str = "target_delta") -> Fraction:
    """Refuse a positive delta below `MIN_FLOAT_DELTA` for a floating-point bound.

    Raises:
        InvalidCostError: For 0 < value < 1e-300, naming the field and the way out.
    """
    if 0 < value < MIN_FLOAT_DELTA:
        raise InvalidCostError(
            field,
            value,
            "is below 1e-300, the smallest delta this floating-point bound supports; use "
            "a delta of at least 1e-300 (a smaller one changes no practical guarantee) or "
            "an exact rule such as 'basic' or 'optimal'",
        )
    return value


def log_inv_bounds(delta: Fraction) -> tuple[float, float]:
    """Floats (low, high) around ln(1/delta) for 0 < delta < 1, for any tiny delta.

    For delta a double can hold, the float path; otherwise ln(denominator) -
    ln(numerator) from the integers (``math.log`` takes big integers), each within an
    ulp or two, widened by their size.
    """
    if delta >= Fraction(1, 2**1000):
        inverse = 1 / delta
        high = math.nextafter(math.nextafter(math.log(float_up(inverse)), math.inf), math.inf)
        low = math.log(float_down(inverse))
        return math.nextafter(math.nextafter(low, -math.inf), -math.inf), high
    log_den, log_num = math.log(delta.denominator), math.log(delta.numerator)
    value = log_den - log_num
    error = 4 * 2.0**-52 * (abs(log_den) + abs(log_num)) + 2.0**-1000
    return value - error, value + error


def check_rate(value: Any, field: str = "rate") -> Fraction:
    """Validate a sampling rate in (0, 1] and return it exactly."""
    result = to_fraction(value, field)
    if result <= 0 or result > 1:
        raise InvalidCostError(field, value, "must be in (0, 1]")
    return result


def check_positive(value: Any, field: str) -> Fraction:
    """Validate a strictly positive finite number and return it exactly."""
    result = to_fraction(value, field)
    if result <= 0:
        raise InvalidCostError(field, value, "must be > 0")
    return result


def check_count(value: Any, field: str = "k", minimum: int = 1) -> int:
    """Validate an integer count (not a bool, not a float) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidCostError(field, value, "must be an integer")
    result = int(value)
    if result < minimum:
        raise InvalidCostError(field, value, f"must be >= {minimum}")
    return result


def float_up(value: Fraction | float) -> float:
    """The smallest float that is >= ``value`` (exact for a Fraction)."""
    result = float(value)
    if Fraction(result) < value:
        result = math.nextafter(result, math.inf)
    return result


def float_down(value: Fraction | float) -> float:
    """The largest float that is <= ``value`` (exact for a Fraction)."""
    result = float(value)
    if Fraction(result) > value:
        result = math.nextafter(result, -math.inf)
    return result


def up(value: float, ulps: int = _DEFAULT_ULPS) -> Fraction:
    """Round a floating-point result of a transcendental computation upward.

    Args:
        value: A float computed with a few correctly-rounded-or-1-ulp operations.
        ulps: How many units in the last place to step toward +inf.

    Returns:
        An exact Fraction at least as large as the true value of the computation.

    Raises:
        InvalidCostError: If the computation produced NaN (a bug or invalid input).
    """
    if math.isnan(value):
        raise InvalidCostError("result", value, "computation produced NaN")
    if math.isinf(value):
        raise InvalidCostError("result", value, "computation overflowed")
    for _ in range(ulps):
        value = math.nextafter(value, math.inf)
    # Guard against subnormal/zero results: a tiny absolute margin on top.
    return Fraction(value)


def down(value: float, ulps: int = _DEFAULT_ULPS) -> Fraction:
    """Round a floating-point result downward (the mirror of `up()`), floored at 0."""
    if math.isnan(value):
        raise InvalidCostError("result", value, "computation produced NaN")
    for _ in range(ulps):
        value = math.nextafter(value, -math.inf)
    return max(Fraction(value), ZERO) if math.isfinite(value) else ZERO


def exp_up(x: Fraction | float) -> float:
    """A float >= exp(x)."""
    return math.nextafter(math.nextafter(math.exp(float_up(x)), math.inf), math.inf)


def log_up(x: Fraction | float) -> float:
    """A float >= ln(x) for x > 0."""
    return math.nextafter(math.nextafter(math.log(float_up(x)), math.inf), math.inf)


def sqrt_up(x: Fraction | float) -> float:
    """A float >= sqrt(x) for x >= 0."""
    return math.nextafter(math.sqrt(float_up(x)), math.inf)


#: Relative error allowed for scipy's normal CDF (ndtr / log_ndtr are accurate to a few
#: ulps, i.e. ~1e-15 relative); each term is pushed this far in the safe direction.
_NDTR_SLACK = 1e-12


def _ratio_up(numerator: int, denominator: int) -> float:
    """The smallest float >= numerator / denominator (denominator > 0): `float_up` of that
    Fraction, without building it (int division is correctly rounded).

    Raises:
        OverflowError: The ratio is beyond the floats (as ``float(Fraction)`` raises).
    """
    result = numerator / denominator
    top, bottom = result.as_integer_ratio()
    if top * denominator < numerator * bottom:
        result = math.nextafter(result, math.inf)
    return result


def gaussian_delta_up(epsilon: Fraction, mu: Fraction) -> Fraction:
    """An upper bound on the exact delta(epsilon) of the Gaussian mechanism.

    With mu = sensitivity / sigma, Balle and Wang 2018 (Thm 8) give the exact condition
    delta(epsilon) = Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu).
    The first term is rounded up and the second down, each by a relative margin that
    covers the error of scipy's normal CDF.

    Args:
        epsilon: The point of the privacy profile, >= 0.
        mu: sensitivity / sigma, > 0.

    Returns:
        An exact Fraction no smaller than the true delta(epsilon).

    Examples:
        >>> 0.1269 < float(gaussian_delta_up(Fraction(1), Fraction(1))) < 0.1270
        True
    """
    # With mu = P/Q and epsilon = R/S: mu/2 -+ epsilon/mu = (P^2 S -+ 2 R Q^2) / (2 P Q S),
    # rounded to floats exactly as `float_up` / `float_down` round those Fractions, in
    # integers (no gcd): a charge of a fresh sigma costs this on the charging path.
    p, q = mu.numerator, mu.denominator
    r, s = epsilon.numerator, epsilon.denominator
    square, cross, scale = p * p * s, 2 * r * q * q, 2 * p * q * s
    a = _ratio_up(square - cross, scale)
    b = -_ratio_up(square + cross, scale)
    first = float(special.ndtr(a)) * (1 + _NDTR_SLACK)
    second = math.exp(-_ratio_up(-r, s) + float(special.log_ndtr(b))) * (1 - _NDTR_SLACK)
    value = first - second
    if value <= 0:
        # The difference is positive in exact arithmetic; a non-positive float means it
        # is below the CDF's resolution. Report the first term's slack as the bound.
        value = float(special.ndtr(a)) * _NDTR_SLACK * 2
    return min(up(value), ONE)


def laplace_epsilon_up(scale: Fraction, sensitivity: Fraction) -> Fraction:
    """epsilon = sensitivity / scale of the Laplace mechanism, exactly."""
    return sensitivity / scale


#: Beyond this epsilon, e^epsilon is computed in logarithms (math.expm1 overflows at ~709.8).
_EXPM1_SAFE: Final = 700
#: An upper bound on e^-700 (= 9.86e-305).
_EXP_MINUS_700_UP: Final = 1e-304


def log1p_expm1_scaled_up(rate: Fraction, epsilon: Fraction) -> Fraction:
    """An upper bound on ln(1 + rate * (e^epsilon - 1)), the amplified epsilon.

    Examples:
        >>> log1p_expm1_scaled_up(Fraction(1), Fraction(1, 2)) >= Fraction(1, 2)
        True
        >>> 993.09 < log1p_expm1_scaled_up(Fraction(1, 1000), Fraction(1000)) < 993.1  # 1000 + ln q
        True
    """
    if rate == 1:
        return epsilon
    if epsilon == 0:
        return ZERO
    if epsilon > _EXPM1_SAFE:
        # ln(1 + q (e^eps - 1)) = eps + ln(q + (1 - q) e^-eps) <= eps + ln(q + e^-700):
        # e^eps overflows a float here, its logarithm does not.
        shift = log_up(math.nextafter(float_up(rate) + _EXP_MINUS_700_UP, math.inf))
        return min(epsilon + up(shift), epsilon)
    inner = float_up(rate) * math.nextafter(math.expm1(float_up(epsilon)), math.inf)
    return min(up(math.log1p(inner), ulps=8), epsilon)


def bisect_geometric(ok: Callable[[float], bool], lo: float, hi: float, rel: float) -> float:
    """The smallest x found in [lo, hi] with ``ok(x)`` (``ok(hi)`` holds, ``ok`` monotone),
    to a relative width ``rel``, by bisection of the logarithm; the point returned
    passes ``ok``.

    Examples:
        >>> round(bisect_geometric(lambda x: x * x >= 2.0, 1.0, 2.0, 1e-9), 6)
        1.414214
    """
    while hi / lo - 1.0 > rel:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
