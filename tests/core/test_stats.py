"""The statistics behind the verdicts, on fixed figures: the t distribution against a printed table,
intervals over passes, the per-request bootstrap, and Welch's t test on two configurations' passes,
with seed 000's and seed 003's figures as worked data."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from llmtrial.core.stats import (
    bootstrap_interval,
    cv,
    mean_interval,
    pass_interval,
    percentile,
    ratio_test,
    t_cdf,
    t_quantile,
)
from llmtrial.report.verdicts import judge, method_line

#: Student t's 97.5th and 95th percentiles by degrees of freedom, from a printed table.
T_TABLE = {1: (12.706, 6.314), 2: (4.303, 2.920), 3: (3.182, 2.353), 5: (2.571, 2.015), 10: (2.228, 1.812),
           30: (2.042, 1.697), 120: (1.980, 1.658)}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantiles_match_the_printed_table(df):
    q975, q95 = T_TABLE[df]
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-3)
    assert t_quantile(0.95, df) == pytest.approx(q95, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-3)
    assert t_cdf(q975, df) == pytest.approx(0.975, abs=1e-4) and t_cdf(0.0, df) == pytest.approx(0.5)


def test_seed_000s_two_passes_agree_within_two_percent_yet_their_interval_is_ten_times_wider():
    # seed 000: "17.48 and 17.77 tokens per second across two passes", "agree to within about 1.7%"
    passes = [17.48, 17.77]
    ci = mean_interval(passes)
    # mean 17.625, sd 0.29 / sqrt 2 = 0.2051, half-width 12.706 x 0.2051 / sqrt 2 = 1.843
    assert (ci.low, ci.high) == pytest.approx((17.625 - 1.843, 17.625 + 1.843), abs=2e-3)
    assert ci.n == 2 and ci.level == 0.95 and ci.method == "Student t on pass values"
    assert cv(passes) == pytest.approx(0.2051 / 17.625, rel=1e-3)  # 1.16 %
    assert mean_interval([17.48]) is None and cv([17.48]) is None
    narrower = mean_interval(passes, level=0.90)  # 6.314 in place of 12.706
    assert narrower.high - narrower.low == pytest.approx(2 * 6.314 * 0.2051 / math.sqrt(2), rel=1e-3)


def test_seed_003s_stall_moves_the_mean_not_the_median_or_its_interval_over_requests():
    # seed 003: twelve requests, "Mean TTFT (ms): 3987.38", "Median TTFT (ms): 265.56", one request stalled ~45 s.
    # Eleven requests around the median and the stall that makes the mean: 12 x 3987.38 - the eleven.
    eleven = [250.0, 255.0, 258.0, 260.0, 262.0, 265.56, 265.56, 268.0, 270.0, 272.0, 275.0]
    ttft = [*eleven, 12 * 3987.38 - sum(eleven)]
    assert statistics.median(ttft) == pytest.approx(265.56) and statistics.fmean(ttft) == pytest.approx(3987.38)
    assert ttft[-1] == pytest.approx(44947.4, abs=0.1)  # "stalled for about 45 seconds"
    median = bootstrap_interval(ttft, statistics.median)
    assert 250.0 <= median.low <= 265.56 <= median.high <= 275.0  # the stall is outside the median's interval
    p99 = bootstrap_interval(ttft, lambda v: percentile(v, 99))
    assert p99.low < 1000 and p99.low < percentile(ttft, 99) <= p99.high == pytest.approx(max(ttft))  # p99 hinges on one request
    assert bootstrap_interval(ttft, statistics.median) == median  # seeded: the same twice
    assert bootstrap_interval([265.56], statistics.median) is None


def test_percentile_interpolates_as_numpy_does():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0


def test_overlapping_passes_give_no_detectable_difference():
    a, b = [484.7, 861.9, 847.6], [558.0, 601.2, 512.4]  # tp1's range covers tp2's
    test = ratio_test(a, b)
    assert test.outcome == "none" and test.low < 1 < test.high and test.p_value > 0.05
    v = judge(a, b, higher=True, level=0.95)
    assert v.word == "no detectable difference" and not v.decided


def test_clearly_separated_passes_give_the_verdict_and_an_interval_containing_the_true_ratio():
    rng = random.Random(7)
    for true in (0.5, 0.8, 1.25, 2.0):
        b = [100.0 * math.exp(rng.gauss(0, 0.02)) for _ in range(3)]
        a = [100.0 * true * math.exp(rng.gauss(0, 0.02)) for _ in range(3)]
        test = ratio_test(a, b)
        assert test.low < true < test.high and test.outcome == ("higher" if true > 1 else "lower")
        assert judge(a, b, higher=True, level=0.95).word == ("faster" if true > 1 else "slower")
        assert judge(a, b, higher=False, level=0.95).word == ("slower" if true > 1 else "faster")  # a latency
        assert judge(a, b, higher=True, level=0.95, key="goodput").word == ("better" if true > 1 else "worse")


def test_the_verdicts_interval_holds_the_true_ratio_about_as_often_as_its_level_says():
    rng = random.Random(11)
    held = 0
    for _ in range(400):
        b = [50.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(3)]
        a = [65.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(3)]
        t = ratio_test(a, b)
        held += t.low < 1.3 < t.high
    assert 0.92 <= held / 400 <= 0.985  # Welch's interval is near its 95 %


def test_one_pass_is_unstable_with_no_interval():
    test = ratio_test([17.48], [17.77, 17.60])
    assert test.outcome == "unstable" and test.low is None and test.ratio == pytest.approx(17.48 / math.sqrt(17.77 * 17.60))
    v = judge([17.48], [17.77, 17.60], higher=True, level=0.95)
    assert v.word == "unstable" and v.as_text().startswith("unstable (fewer than two passes), 0.99x (no interval")


def test_passes_too_spread_to_say_are_unstable_not_a_tie_but_a_detected_difference_stands():
    wide = judge([100.0, 180.0, 120.0], [110.0, 150.0, 95.0], higher=True, level=0.95, wide=True)
    assert wide.word == "unstable" and wide.reason == "passes disagree too widely to say"
    clear = judge([300.0, 310.0, 290.0], [100.0, 130.0, 95.0], higher=True, level=0.95, wide=True)
    assert clear.word == "faster"


def test_a_zero_figure_is_compared_on_the_difference_without_a_ratio_interval():
    test = ratio_test([0.0, 0.0, 0.1], [1.0, 1.1, 0.9])
    assert test.outcome == "lower" and test.low is None and test.ratio == pytest.approx(0.1 / 3 / 1.0)
    assert ratio_test([0.0, 0.0], [0.0, 0.0]).ratio is None


def test_the_method_line_names_the_level_and_every_test():
    line = method_line(0.9, 2000, 0)
    assert line.startswith("Confidence level 90 %.") and "Student t on the logarithms of pass values" in line
    assert "unresolved where the ratio's interval spans more than a factor of 100" in line
    assert "a latency whose median is at or below 0.01 ms is at the timer's resolution" in line
    assert "Welch's t on the logarithms of pass values" in line and "2000 resamples, seed 0" in line


# ------------------------------------------------------------------ intervals that stay where the figure can be

#: Six skewed TTFT pass medians (ms) of the kind whose mean interval crossed zero ("CI -12.4-54.1" for a
#: median of 8.2 ms): one slow pass among fast ones.
SKEWED_TTFT = [6.9, 7.4, 8.0, 8.4, 9.1, 88.3]


def test_an_interval_over_positive_passes_is_the_logarithms_t_interval_and_never_below_zero():
    plain = mean_interval(SKEWED_TTFT)
    assert plain.low < 0  # the Student t interval of the mean leaves what a latency can be
    ci = pass_interval(SKEWED_TTFT)
    logs = [math.log(v) for v in SKEWED_TTFT]
    half = 2.571 * statistics.stdev(logs) / math.sqrt(6)  # t 97.5 % at 5 degrees of freedom
    assert (ci.low, ci.high) == pytest.approx((math.exp(statistics.fmean(logs) - half),
                                               math.exp(statistics.fmean(logs) + half)), rel=1e-3)
    assert 0 < ci.low < statistics.median(SKEWED_TTFT) < ci.high
    assert pass_interval([8.2]) is None


def test_an_interval_over_passes_with_a_zero_is_a_bootstrap_within_the_values_and_a_negative_one_the_plain_t():
    counts = [0.0, 0.0, 3.0, 1.0]  # preemptions per pass
    ci = pass_interval(counts)
    assert ci.method == "percentile bootstrap of the mean over pass values (a value is 0)"
    assert 0 <= ci.low <= statistics.fmean(counts) <= ci.high <= 3.0
    assert pass_interval(counts) == ci  # seeded: the same report twice
    deltas = [-1.0, 2.0, 0.5]
    assert pass_interval(deltas) == mean_interval(deltas)


def test_a_latency_at_the_timers_resolution_gets_no_ratio_and_no_verdict():
    v = judge([0.004, 0.006, 0.005], [2.40, 2.42, 2.45], higher=False, level=0.95, key="tpot_median_ms")
    assert v.word == "at resolution" and not v.decided
    assert v.ratio_text() == "no ratio (a median is at or below the timer's resolution, 0.01 ms)"
    assert judge([0.004, 0.006, 0.005], [2.40, 2.42, 2.45], higher=True, level=0.95, key="output_tok_s").decided


def test_a_ratio_whose_interval_spans_more_than_a_factor_of_100_is_unresolved():
    wide = judge([0.5, 40.0], [1.0, 1.2], higher=False, level=0.95, key="tpot_p99_ms")
    assert wide.test.high / wide.test.low > 100
    assert wide.word == "unresolved" and not wide.decided
    assert wide.as_text().startswith("unresolved (its interval spans more than a factor of 100), ")
    narrow = judge([10.0, 11.0, 10.5], [20.0, 21.0, 20.5], higher=False, level=0.95, key="tpot_p99_ms")
    assert narrow.word == "faster" and narrow.test.high / narrow.test.low < 100
