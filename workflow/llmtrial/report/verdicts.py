"""Verdicts between two sets of pass values, in the words the report and the comparison page use.

A verdict comes from :func:`llmtrial.core.stats.ratio_test` (Welch's t on the logarithms of the
pass values): ``faster`` or ``slower`` (``better`` or ``worse`` for goodput figures) only where
the ratio's interval at the stated level excludes 1; ``no detectable difference`` where it does
not; ``unstable`` where a side has fewer than two passes, or where no difference was detected and
a side's passes disagree by more than the trial's threshold (too wide to say); ``unresolved`` where
the ratio's interval spans more than :data:`~llmtrial.core.stats.WIDEST_RATIO` (high over low); and
``at resolution``, with no ratio, where a latency's median on either side is at or below
:data:`~llmtrial.core.stats.RESOLUTION_MS`. The ratio is never quoted without its interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from llmtrial.core.stats import (
    BOOTSTRAP_METHOD,
    LOG_T_METHOD,
    PASS_BOOTSTRAP_METHOD,
    RATIO_METHOD,
    RESOLUTION_MS,
    WIDEST_RATIO,
    RatioTest,
    one_run_test,
    ratio_test,
)

NO_DIFFERENCE = "no detectable difference"
UNSTABLE = "unstable"
UNRESOLVED = "unresolved"
AT_RESOLUTION = "at resolution"
#: The figures judged as better or worse rather than faster or slower (goodput, and what a token costs in
#: money or energy).
RATE_FIGURES = frozenset({"goodput", "slo_share", "cost_per_mtok", "energy_per_token_j"})


@dataclass(frozen=True)
class Verdict:
    """A against B on one figure: the verdict's word, the test behind it, and why it is unstable."""

    word: str
    test: RatioTest
    reason: str | None = None

    @property
    def decided(self) -> bool:
        """Whether a difference was detected (faster, slower, better or worse)."""
        return self.word not in (NO_DIFFERENCE, UNSTABLE, UNRESOLVED, AT_RESOLUTION)

    def ratio_text(self) -> str:
        """The ratio with its interval: ``1.52x (95 % CI 1.10–2.09x)``; without one, why."""
        t = self.test
        if self.word == AT_RESOLUTION:
            return f"no ratio (a median is at or below the timer's resolution, {RESOLUTION_MS:g} ms)"
        if t.ratio is None:
            return "no ratio (a figure is 0 or missing)"
        if t.low is None or t.high is None:
            why = "fewer than two passes" if min(t.n_a, t.n_b) < 2 else "a value is 0"
            return f"{t.ratio:.2f}x (no interval: {why})"
        return f"{t.ratio:.2f}x ({100 * t.level:g} % CI {t.low:.2f}–{t.high:.2f}x)"

    def as_text(self) -> str:
        """The verdict and the ratio: ``slower, 0.41x (95 % CI 0.38–0.44x)``; an unstable one says why."""
        word = f"{self.word} ({self.reason})" if self.reason else self.word
        return f"{word}, {self.ratio_text()}"


def judge(a: Sequence[float], b: Sequence[float], *, higher: bool, level: float, key: str = "",
          wide: bool = False, one_run: bool = False) -> Verdict:
    """A's pass values against B's on a figure where ``higher`` is better; ``wide``: a side's passes
    disagree by more than the trial's threshold; ``one_run``: a side of one run is tested against the
    other side's runs (:func:`llmtrial.core.stats.one_run_test`) rather than called unstable."""
    test = one_run_test(a, b, level) if one_run else ratio_test(a, b, level)
    better, worse = ("better", "worse") if key in RATE_FIGURES else ("faster", "slower")
    if key.endswith("_ms") and a and b and min(statistics.median(a), statistics.median(b)) <= RESOLUTION_MS:
        return Verdict(AT_RESOLUTION, test, f"a median is at or below the timer's resolution, {RESOLUTION_MS:g} ms")
    if test.outcome == "unstable":
        return Verdict(UNSTABLE, test, "fewer than two passes")
    if test.low and test.high and test.high / test.low > WIDEST_RATIO:
        return Verdict(UNRESOLVED, test, f"its interval spans more than a factor of {WIDEST_RATIO:g}")
    if test.outcome == "none":
        return Verdict(UNSTABLE, test, "passes disagree too widely to say") if wide else Verdict(NO_DIFFERENCE, test)
    return Verdict(better if (test.outcome == "higher") == higher else worse, test)


def method_line(level: float, resamples: int, seed: int) -> str:
    """The one line an auditor checks: the level and every method behind the intervals and verdicts."""
    return (f"Confidence level {100 * level:g} %. Intervals over passes: {LOG_T_METHOD}, never below 0 (where a "
            f"pass value is 0: a {PASS_BOOTSTRAP_METHOD.split(' (')[0]}), with the coefficient of variation (sample "
            f"standard deviation over mean). Latency figures also carry a {BOOTSTRAP_METHOD} of all passes together "
            f"({resamples} resamples, seed {seed}). Verdicts: {RATIO_METHOD}; faster or slower only where the ratio's "
            f"interval excludes 1, otherwise no detectable difference; unstable below two passes a side; unresolved "
            f"where the ratio's interval spans more than a factor of {WIDEST_RATIO:g}; a latency whose median is at "
            f"or below {RESOLUTION_MS:g} ms is at the timer's resolution (tokens that arrived in one read of the "
            f"stream) and gets no ratio and no verdict.")
