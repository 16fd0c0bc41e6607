"""The statistics behind every verdict: intervals over passes, over requests, and of a ratio.

- :func:`pass_interval`: a figure's interval over passes, at a level (95 % unless the trial file's
  ``statistics.level`` says otherwise), by a method that never leaves what the figure can be: the
  Student t interval on the logarithms of positive pass values (the geometric mean's), a percentile
  bootstrap over pass values where one is 0, the plain Student t interval only where a value is
  negative; with :func:`cv`, the coefficient of variation (sample standard deviation over mean).
  :func:`mean_interval` is the plain Student t interval of the mean. The passes' interval rule
  (:class:`llmtrial.serve.scenarios.RepetitionRule`) stops on the width of :func:`pass_interval`.
- :func:`bootstrap_interval`: a percentile bootstrap interval of a statistic (the median, the
  p99) over per-request samples, with a fixed seed so a report renders the same twice.
- :func:`ratio_test`: Welch's t test on the logarithms of two configurations' pass values. The
  ratio it quotes is the ratio of their geometric means, and its interval is the exponentiated
  Welch interval of the difference of mean logarithms, so "higher" or "lower" is said exactly
  when that interval excludes 1. Fewer than two passes on either side gives "unstable".
- :func:`one_run_test`: one run on a side (another tool's report holds one run's aggregates) against
  the other side's two or more: the run's logarithm against the others' mean with their spread (a
  t prediction interval), assuming the lone side's runs would vary as the other side's do.

No third-party dependency: the t distribution comes from the regularized incomplete beta
function (Numerical Recipes' continued fraction), the quantile from bisection on it.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
T_METHOD = "Student t on pass values"
LOG_T_METHOD = "Student t on the logarithms of pass values (the geometric mean's interval)"
PASS_BOOTSTRAP_METHOD = "percentile bootstrap of the mean over pass values (a value is 0)"
#: The rules every verdict follows (the report's method line states them, :func:`llmtrial.report.verdicts.method_line`):
#: a latency median at or below this many milliseconds is at the timer's resolution (tokens that arrived in one read
#: of the stream), and gets no ratio and no verdict.
RESOLUTION_MS = 0.01
#: A ratio whose interval spans more than this factor (high over low: two orders of magnitude) is unresolved, neither
#: faster nor slower: it says nothing about the size of the difference.
WIDEST_RATIO = 100.0
BOOTSTRAP_METHOD = "percentile bootstrap over per-request samples"
RATIO_METHOD = "Welch's t on the logarithms of pass values (ratio of geometric means)"
DIFFERENCE_METHOD = "Welch's t on pass values (a value is 0: ratio of means, no interval)"
ONE_RUN_METHOD = ("t on logarithms, the lone run against the other side's runs with their spread (a prediction "
                  "interval: assumes the lone side's runs vary as the other side's do)")


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df may be fractional: Welch)."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=1024)  # a pure function asked the same few (level, passes) pairs over and over
def t_quantile(p: float, df: float) -> float:
    """The t value below which a share ``p`` of Student's t with ``df`` degrees of freedom lies."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, not {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def two_sided(level: float) -> float:
    """The upper quantile's share for a two-sided interval at ``level`` (0.95 -> 0.975)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is between 0 and 1, not {level}")
    return 1.0 - (1.0 - level) / 2.0


@dataclass(frozen=True)
class Interval:
    """An interval ``[low, high]`` at ``level`` by ``method`` from ``n`` values."""

    low: float
    high: float
    level: float
    method: str
    n: int

    def width_over(self, centre: float) -> float | None:
        """The interval's width over ``centre`` (its relative width; None at 0)."""
        return (self.high - self.low) / abs(centre) if centre else None


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation: sample standard deviation over the mean; None below two values or at mean 0."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / abs(mean) if mean else None


def mean_interval(values: Sequence[float], level: float = DEFAULT_LEVEL) -> Interval | None:
    """The Student t interval of the mean of ``values`` (passes); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(two_sided(level), n - 1) * sd / math.sqrt(n)
    return Interval(mean - half, mean + half, level, T_METHOD, n)


def pass_interval(values: Sequence[float], level: float = DEFAULT_LEVEL, seed: int = DEFAULT_SEED) -> Interval | None:
    """A figure's interval over passes that stays where the figure can be (module docstring); None below two."""
    n = len(values)
    if n < 2:
        return None
    if min(values) > 0:
        logs = [math.log(v) for v in values]
        centre, half = statistics.fmean(logs), t_quantile(two_sided(level), n - 1) * statistics.stdev(logs) / math.sqrt(n)
        return Interval(math.exp(centre - half), math.exp(centre + half), level, LOG_T_METHOD, n)
    if min(values) == 0:
        boot = bootstrap_interval(values, statistics.fmean, level, seed=seed)
        assert boot is not None
        return Interval(boot.low, boot.high, level, PASS_BOOTSTRAP_METHOD, n)
    return mean_interval(values, level)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation between order statistics (numpy's default, vLLM's)."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bootstrap_interval(samples: Sequence[float], stat: Callable[[Sequence[float]], float], level: float = DEFAULT_LEVEL,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> Interval | None:
    """A percentile bootstrap interval of ``stat`` over ``samples`` (resampled with replacement
    ``resamples`` times from a generator seeded with ``seed``); None below two samples."""
    n = len(samples)
    if n < 2:
        return None
    rng = random.Random(seed)
    values = list(samples)
    stats_ = sorted(stat(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return Interval(percentile(stats_, 100 * tail), percentile(stats_, 100 * (1 - tail)), level, BOOTSTRAP_METHOD, n)


@dataclass(frozen=True)
class RatioTest:
    """Two configurations' pass values compared: the ratio A / B, its interval (None where it has
    none), and the outcome: ``higher`` or ``lower`` (A's values are detectably higher or lower),
    ``none`` (no detectable difference at ``level``) or ``unstable`` (fewer than two passes on a side)."""

    ratio: float | None
    low: float | None
    high: float | None
    level: float
    outcome: str
    method: str
    n_a: int
    n_b: int
    df: float | None = None
    p_value: float | None = None


def _welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(difference of means, its standard error, Welch-Satterthwaite degrees of freedom)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    denom = (va * va / (len(a) - 1) if va else 0.0) + (vb * vb / (len(b) - 1) if vb else 0.0)
    df = (va + vb) ** 2 / denom if denom else float(len(a) + len(b) - 2)
    return statistics.fmean(a) - statistics.fmean(b), se, df


def _outcome(diff: float, half: float) -> str:
    if diff - half > 0:
        return "higher"
    if diff + half < 0:
        return "lower"
    return "none"


def ratio_test(a: Sequence[float], b: Sequence[float], level: float = DEFAULT_LEVEL) -> RatioTest:
    """A's pass values against B's by Welch's t test (module docstring); the ratio is A over B."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    n_a, n_b = len(a), len(b)
    if not a or not b:
        return RatioTest(None, None, None, level, "unstable", RATIO_METHOD, n_a, n_b)
    positive = min(a) > 0 and min(b) > 0
    if n_a < 2 or n_b < 2:
        ratio = _geo(a) / _geo(b) if positive else _plain_ratio(a, b)
        return RatioTest(ratio, None, None, level, "unstable", RATIO_METHOD if positive else DIFFERENCE_METHOD, n_a, n_b)
    if not positive:
        diff, se, df = _welch(a, b)
        half = t_quantile(two_sided(level), df) * se
        return RatioTest(_plain_ratio(a, b), None, None, level, _outcome(diff, half), DIFFERENCE_METHOD, n_a, n_b, df,
                         _p_value(diff, se, df))
    diff, se, df = _welch([math.log(v) for v in a], [math.log(v) for v in b])
    half = t_quantile(two_sided(level), df) * se
    return RatioTest(math.exp(diff), math.exp(diff - half), math.exp(diff + half), level, _outcome(diff, half),
                     RATIO_METHOD, n_a, n_b, df, _p_value(diff, se, df))


def one_run_test(a: Sequence[float], b: Sequence[float], level: float = DEFAULT_LEVEL) -> RatioTest:
    """A against B where one side holds one positive value and the other two or more (module docstring): the
    ratio A / B of the lone value over the others' geometric mean, its interval from the others' spread
    (standard error ``s * sqrt(1 + 1/n)`` on logarithms, ``n - 1`` degrees of freedom). Any other shape, or a
    value that is not positive, is :func:`ratio_test`'s."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if sorted((len(a), len(b)))[0] != 1 or max(len(a), len(b)) < 2 or min(a + b) <= 0:
        return ratio_test(a, b, level)
    lone, many = (a, b) if len(a) == 1 else (b, a)
    logs = [math.log(v) for v in many]
    sign = 1.0 if lone is a else -1.0
    diff = sign * (math.log(lone[0]) - statistics.fmean(logs))
    se, df = statistics.stdev(logs) * math.sqrt(1.0 + 1.0 / len(logs)), float(len(logs) - 1)
    half = t_quantile(two_sided(level), df) * se
    return RatioTest(math.exp(diff), math.exp(diff - half), math.exp(diff + half), level, _outcome(diff, half),
                     ONE_RUN_METHOD, len(a), len(b), df, _p_value(diff, se, df))


def _geo(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _plain_ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    mb = statistics.fmean(b)
    return statistics.fmean(a) / mb if mb else None


def _p_value(diff: float, se: float, df: float) -> float:
    """Two-sided p value of Welch's t statistic (0 or 1 when the standard error is 0)."""
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return 2.0 * (1.0 - t_cdf(abs(diff) / se, df))
