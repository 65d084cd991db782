"""The numbers users give the launcher (-np, slots, seconds, knob values), parsed strictly.

Python's int() and float() accept more than a user means: digits of any script ('٣' is 3), '_'
between digits, spaces around, 'nan' and 'inf'. These accept ASCII digits only, and finite numbers.
Each raises ValueError with what is expected and the value given ("a whole number from 1 to
2147483647 (digits 0-9), got '²'"); the caller says which option it was.
"""

import math
import re

# MPI counts ranks in a C int.
MAX_RANKS = 2**31 - 1
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_int(text: str, lo: int, hi: int) -> int:
    """`text` as a whole number in [lo, hi] (lo >= 0), written with the digits 0-9 only."""
    expected = f"a whole number from {lo} to {hi} (digits 0-9), got {text!r}"
    if not (text.isascii() and text.isdigit()):
        raise ValueError(expected)
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(hi)) or not lo <= int(digits) <= hi:
        raise ValueError(expected)
    return int(digits)


def parse_float(text: str) -> float:
    """`text` as a finite decimal number ('2', '-0.5', '1e3'), written with the digits 0-9 only."""
    value = float(text) if _FLOAT_RE.fullmatch(text) else math.nan
    if not math.isfinite(value):
        raise ValueError(f"a finite decimal number (digits 0-9, like 2.5 or 1e3), got {text!r}")
    return value
