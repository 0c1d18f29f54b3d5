"""Pure statistics over lists of measurements, and the two ways the report
and the progress lines write a number (milliseconds from nanoseconds, and a
ratio). No I/O. A missing value is nan, written "—"."""
import math


def pct(xs, p):
    """The p-th percentile (linear interpolation); nan for no data."""
    s = sorted(xs)
    if not s:
        return math.nan
    k = (len(s) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def median(xs):
    return pct(xs, 50)


def ratio(a, b):
    """a / b; nan when either is missing or b is 0."""
    if b is None or a is None or b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def nan_le(a, b):
    """a <= b; None when either is nan (no data to judge on)."""
    return None if math.isnan(a) or math.isnan(b) else a <= b


def ms(ns, digits=3):
    """Nanoseconds written as milliseconds."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "—"
    return f"{ns / 1e6:.{digits}f}"


def rt(x):
    """A ratio written with two decimals."""
    return "—" if x is None or math.isnan(x) else f"{x:.2f}"
