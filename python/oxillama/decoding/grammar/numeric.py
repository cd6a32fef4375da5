"""JSON numbers as GBNF: unbounded forms, exact integer ranges, and bounded
decimals.

Bounds are enforced on the digits themselves. An integer range becomes, per
numeral length, the classic "first digit at the bound, then a smaller range;
or a digit strictly inside, then anything" decomposition. A bounded number
is the union of two exact languages:

* integer numerals (no ``.``, no exponent) in the integer range the bounds
  allow, compared exactly as JSON Schema validators compare ints with floats;
* numerals with a fraction (and no exponent) whose decimal value lies in
  ``[L, H]``, where ``L`` is the shortest decimal of the smallest double
  satisfying the lower bound (likewise ``H``). Because parsing rounds
  monotonically and a double's shortest decimal parses back to it, every such
  numeral parses to a double inside the bounds; the only values lost are
  numerals that round onto the bound from outside it.

Unbounded digit runs are capped so a model cannot emit digits forever:
integer parts at :data:`INT_DIGITS` digits (enough for any int64/uint64),
fractions at :data:`FRACTION_DIGITS` (enough for any double's shortest
repr), exponents at :data:`EXPONENT_DIGITS`, which also keeps every number
a finite double (at most about 1e120). Explicit bounds are exact at any
size.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from oxillama.decoding.grammar.gbnf_writer import (
    EMPTY,
    Expr,
    alt,
    char_class,
    literal,
    opt,
    rep,
    seq,
)

__all__ = [
    "EXPONENT_DIGITS",
    "FRACTION_DIGITS",
    "INT_DIGITS",
    "bounded_number",
    "digit_strings",
    "integer_range",
    "naturals",
    "unbounded_integer",
    "unbounded_number",
]

INT_DIGITS = 20
FRACTION_DIGITS = 24
EXPONENT_DIGITS = 2


def _digit(lo: int, hi: int) -> Expr:
    return char_class(((0x30 + lo, 0x30 + hi),))


_ANY_DIGIT = _digit(0, 9)
_E = ((0x45, 0x45), (0x65, 0x65))
_SIGNS = ((0x2B, 0x2B), (0x2D, 0x2D))


def unbounded_integer() -> Expr:
    return seq(opt(literal("-")), _magnitude())


def _magnitude() -> Expr:
    return alt(literal("0"), seq(_digit(1, 9), rep(_ANY_DIGIT, 0, INT_DIGITS - 1)))


def unbounded_number() -> Expr:
    return seq(
        opt(literal("-")),
        _magnitude(),
        opt(seq(literal("."), rep(_ANY_DIGIT, 1, FRACTION_DIGITS))),
        opt(seq(char_class(_E), opt(char_class(_SIGNS)), rep(_ANY_DIGIT, 1, EXPONENT_DIGITS))),
    )


def digit_strings(
    lo: tuple[int, ...] | None, hi: tuple[int, ...] | None, min_len: int, max_len: int
) -> Expr | None:
    """Decimal digit strings ``d`` with ``min_len <= len(d) <= max_len`` and
    ``lo <= d <= hi``, comparing strings as fractions do (right-padded with
    zeros; for equal lengths that is numeric order). A None bound is no
    bound; None is returned when no string qualifies."""
    if lo is not None and not any(lo):
        lo = None  # a lower bound of zeros bounds nothing
    if max_len < min_len:
        return None
    if lo is None and hi is None:
        return rep(_ANY_DIGIT, min_len, max_len)
    if lo is None and hi is not None and not any(hi):
        return rep(_digit(0, 0), min_len, max_len)  # at most zero: only zeros
    options: list[Expr] = []
    if min_len == 0 and lo is None:
        options.append(EMPTY)  # ending here pads with zeros, which is <= any hi
    if max_len >= 1:
        nmin, nmax = max(min_len - 1, 0), max_len - 1
        l0 = lo[0] if lo is not None else None
        h0 = (hi[0] if hi else 0) if hi is not None else None
        lo_tail = lo[1:] if lo is not None else None
        hi_tail = hi[1:] if hi is not None else None
        # (first digit range, what may follow it), in digit order.
        pieces: list[tuple[int, int, Expr | None]] = []
        if l0 is not None and l0 == h0:
            pieces.append((l0, l0, digit_strings(lo_tail, hi_tail, nmin, nmax)))
        else:
            a = 0 if l0 is None else l0
            b = 9 if h0 is None else h0
            if l0 is not None and a <= b:
                pieces.append((a, a, digit_strings(lo_tail, None, nmin, nmax)))
                a += 1
            if h0 is not None:
                b -= 1
            if a <= b:
                pieces.append((a, b, digit_strings(None, None, nmin, nmax)))
            if h0 is not None and (l0 is None or l0 < h0):
                pieces.append((h0, h0, digit_strings(None, hi_tail, nmin, nmax)))
        merged: list[tuple[int, int, Expr]] = []
        for first, last, tail in pieces:
            if tail is None:
                continue
            if merged and merged[-1][2].text == tail.text and merged[-1][1] + 1 == first:
                merged[-1] = (merged[-1][0], last, tail)
            else:
                merged.append((first, last, tail))
        options += [seq(_digit(first, last), tail) for first, last, tail in merged]
    return alt(*options) if options else None


def _digits(n: int) -> tuple[int, ...]:
    return tuple(int(c) for c in str(n))


def _fixed_length(x: int, y: int) -> Expr | None:
    """Numerals of x..y, both with the same number of digits."""
    n = len(str(x))
    return digit_strings(_digits(x), _digits(y), n, n)


def naturals(a: int, b: int | None) -> Expr | None:
    """Canonical numerals (no leading zeros) of the integers ``a..b``
    (``a >= 0``; ``b`` None: up to INT_DIGITS digits, or ``a``'s length)."""
    if b is not None and b < a:
        return None
    la = len(str(a))
    top = 10**la - 1
    if b is not None and b <= top:
        return _fixed_length(a, b)
    options = [_fixed_length(a, top)]
    if b is None:
        longest = max(INT_DIGITS, la)
        if longest > la:
            options.append(seq(_digit(1, 9), rep(_ANY_DIGIT, la, longest - 1)))
    else:
        lb = len(str(b))
        if lb - 1 > la:
            options.append(seq(_digit(1, 9), rep(_ANY_DIGIT, la, lb - 2)))
        options.append(_fixed_length(10 ** (lb - 1), b))
    present = [o for o in options if o is not None]
    return alt(*present) if present else None


def integer_range(lo: int | None, hi: int | None) -> Expr | None:
    """Canonical integer numerals in ``lo..hi`` (None: unbounded on that
    side); None when the range is empty."""
    if lo is None and hi is None:
        return unbounded_integer()
    if lo is not None and hi is not None and lo > hi:
        return None
    options: list[Expr] = []
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)
        mags = naturals(-top, None if lo is None else -lo)
        if mags is not None:
            options.append(seq(literal("-"), mags))
    if hi is None or hi >= 0:
        mags = naturals(max(lo or 0, 0), hi)
        if mags is not None:
            options.append(mags)
    return alt(*options) if options else None


# ----------------------------------------------------------------- bounded numbers


def _split(d: Decimal) -> tuple[int, tuple[int, ...]]:
    """Integer part and fraction digits (no trailing zeros) of ``d >= 0``."""
    text = format(d, "f")
    whole, _, frac = text.partition(".")
    return int(whole), tuple(int(c) for c in frac.rstrip("0"))


def _fraction_magnitudes(a: Decimal, b: Decimal | None) -> Expr | None:
    """``I.F`` (1..FRACTION_DIGITS fraction digits) with ``a <= I.F <= b``."""
    ia, fa = _split(a)
    dot = literal(".")

    def frac(lo: tuple[int, ...] | None, hi: tuple[int, ...] | None) -> Expr | None:
        return digit_strings(lo, hi, 1, FRACTION_DIGITS)

    def piece(whole: Expr | None, fraction: Expr | None) -> Expr | None:
        return None if whole is None or fraction is None else seq(whole, dot, fraction)

    if b is not None:
        ib, fb = _split(b)
        if ia == ib:
            return piece(naturals(ia, ia), frac(fa, fb))
    options = [
        piece(naturals(ia, ia), frac(fa, None)),
        piece(naturals(ia + 1, None if b is None else ib - 1), frac(None, None)),
    ]
    if b is not None:
        options.append(piece(naturals(ib, ib), frac(None, fb)))
    present = [o for o in options if o is not None]
    return alt(*present) if present else None


def _float_bound(x: Fraction, *, above: bool, strict: bool) -> float | None:
    """The double nearest ``x`` on the allowed side: the smallest double
    ``>= x`` (``> x`` when ``strict``) if ``above``, else the largest ``<=``
    (``<``). None when no finite double qualifies; +-inf when every does."""
    toward = math.inf if above else -math.inf
    try:
        f = float(x)
    except OverflowError:
        return None if (x > 0) == above else -toward
    while not math.isinf(f):
        exact = Fraction(f)
        if exact == x:
            if not strict:
                return f
        elif (exact > x) == above:
            return f
        f = math.nextafter(f, toward)
    return None


def bounded_number(
    lo: Fraction | None, lo_strict: bool, hi: Fraction | None, hi_strict: bool
) -> Expr | None:
    """Numerals of numbers within the bounds (see the module docstring);
    None when no numeral qualifies."""
    int_lo = None if lo is None else (math.floor(lo) + 1 if lo_strict else math.ceil(lo))
    int_hi = None if hi is None else (math.ceil(hi) - 1 if hi_strict else math.floor(hi))
    options: list[Expr] = []
    ints = integer_range(int_lo, int_hi)
    if ints is not None:
        options.append(ints)
    f_lo = None if lo is None else _float_bound(lo, above=True, strict=lo_strict)
    f_hi = None if hi is None else _float_bound(hi, above=False, strict=hi_strict)
    if (lo is None or f_lo is not None) and (hi is None or f_hi is not None):
        low = None if f_lo is None or math.isinf(f_lo) else Decimal(repr(f_lo))
        high = None if f_hi is None or math.isinf(f_hi) else Decimal(repr(f_hi))
        fractions = _fractionals(low, high)
        if fractions is not None:
            options.append(fractions)
    return alt(*options) if options else None


def _fractionals(low: Decimal | None, high: Decimal | None) -> Expr | None:
    """Numerals with a fraction part whose value lies in ``[low, high]``."""
    if low is not None and high is not None and low > high:
        return None
    zero = Decimal(0)
    options: list[Expr] = []
    if low is None or low <= 0:
        # Negative numerals "-m": m in [max(0, -high), -low]; "-0.0" is 0.
        m_lo = zero if high is None or high >= 0 else -high
        mags = _fraction_magnitudes(m_lo, None if low is None else -low)
        if mags is not None:
            options.append(seq(literal("-"), mags))
    if high is None or high >= 0:
        mags = _fraction_magnitudes(zero if low is None or low < 0 else low, high)
        if mags is not None:
            options.append(mags)
    return alt(*options) if options else None
