"""Cost per million output tokens and energy per output token (llmtrial.core.cost): the arithmetic on worked
numbers, and the per configuration x scenario figure an exporter reads from a configuration record."""

from __future__ import annotations

import copy
import statistics

import pytest

import synthetic
from llmtrial.config import ConfigError, validate_config
from llmtrial.core.cost import (
    Cost,
    cost_per_million_output_tokens,
    energy_per_output_token,
    hosts_of,
    scenario_cost,
)
from llmtrial.core.record_models import PlanRecord
from synthetic import as_model, demo


def test_mlcommons_worked_example_is_0_2177_joules_per_token():
    # MLCommons' power example: 1,045,212 J over 4,800,915 tokens
    assert round(energy_per_output_token(1_045_212, 4_800_915), 4) == 0.2177


def test_cost_worked_example_two_accelerators_at_2_dollars_serving_1000_tok_s():
    # by hand: 2.00 USD x 2 accelerators = 4.00 USD an hour; 1,000 tok/s x 3,600 s = 3,600,000 tokens an hour;
    # 4.00 / 3,600,000 x 1,000,000 = 1.111 USD per million output tokens
    by_hand = 2.00 * 2 / (1000 * 3600) * 1_000_000
    assert cost_per_million_output_tokens(2.00, 2, 1000.0) == pytest.approx(by_hand)
    assert round(cost_per_million_output_tokens(2.00, 2, 1000.0), 3) == 1.111


@pytest.mark.parametrize("units, tok_s", [(None, 1000.0), (0, 1000.0), (2, None), (2, 0.0)])
def test_no_cost_without_units_or_throughput(units, tok_s):
    assert cost_per_million_output_tokens(2.0, units, tok_s) is None


@pytest.mark.parametrize("joules, tokens", [(None, 100), (10.0, 0), (10.0, None)])
def test_no_energy_per_token_without_energy_or_tokens(joules, tokens):
    assert energy_per_output_token(joules, tokens) is None


def test_a_cost_block_without_price_or_currency_names_the_key():
    trial = {"trial": "t", "model": {"name": "m", "source": {"kind": "tiny"}}, "configurations": {"a": {}},
             "scenarios": {"s": {}}}
    assert validate_config({**trial, "cost": None})["cost"] is None
    with pytest.raises(ConfigError) as err:
        validate_config({**trial, "cost": {"per": "host_hour"}})
    problems = dict(line.strip().split(": ", 1) for line in str(err.value).splitlines()[1:])
    assert sorted(problems) == ["config key 'cost.currency'", "config key 'cost.price'"]
    assert "ISO 4217" in problems["config key 'cost.currency'"] and problems["config key 'cost.price'"].startswith("missing")


def test_the_plan_counts_data_times_tensor_times_pipeline_parallel_ranks():
    plan = demo("plan-tp2", "plan")
    assert plan.accelerators == 2  # written before data_parallel_size was recorded: 1
    dp = PlanRecord.model_validate({**plan.model_dump(by_alias=True), "plan": {**plan.plan, "data_parallel_size": 3}})
    assert dp.accelerators == 6


def fixed_record(tok_s: list[float], name: str = "tp2") -> object:
    """A configuration record with one scenario c4 whose passes ran at ``tok_s`` (synthetic's passes)."""
    tp1, tp2 = synthetic.records()
    rec = copy.deepcopy(tp2 if name == "tp2" else tp1)
    rec["scenarios"] = [synthetic.fixed("c4", 4, tok_s)]
    return as_model("configuration", rec)


def test_a_scenarios_cost_is_the_median_over_passes_at_the_accelerator_price():
    record = fixed_record([1000.0, 800.0, 1250.0])
    cost = Cost(price=2.00, per="accelerator_hour", currency="USD")
    got = scenario_cost(record, "c4", cost, accelerators=2)
    # each pass's own cost, by hand, then their median (the middle pass: 1,000 tok/s)
    per_pass = [2.00 * 2 / (t * 3600) * 1e6 for t in (1000.0, 800.0, 1250.0)]
    assert got.cost_per_million_output_tokens == pytest.approx(statistics.median(per_pass))
    assert got.cost_per_million_output_tokens == pytest.approx(4 / 3.6)
    assert (got.units, got.currency, got.passes) == (2, "USD", 3)
    assert got.energy_per_output_token_j is None and got.energy_kind is None  # synthetic passes sampled no GPU


def test_a_host_hour_price_counts_the_hosts_a_configuration_spans():
    two = as_model("configuration", synthetic.two_node_record())
    assert hosts_of(two) == 2 and hosts_of(fixed_record([100.0])) == 1
    cost = Cost(price=10.0, per="host_hour", currency="EUR", note="example")
    got = scenario_cost(two, two.scenarios[0].name, cost, accelerators=2)
    tok_s = [p.summary.output_throughput for p in two.scenarios[0].ok_passes()]
    assert got.units == 2
    assert got.cost_per_million_output_tokens == pytest.approx(statistics.median([10.0 * 2 / (t * 3600) * 1e6 for t in tok_s]))
    assert cost.rate == "10.00 EUR per host-hour (example)" and cost.unit == "EUR per million output tokens"


def test_a_scenario_the_configuration_did_not_run_has_no_figure():
    got = scenario_cost(fixed_record([1000.0]), "c1", Cost(price=1.0, per="accelerator_hour", currency="USD"), 1)
    assert got.passes == 0 and got.cost_per_million_output_tokens is None
