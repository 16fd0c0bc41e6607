"""The real trials in config/trials/, planned as the workflow plans them, and a trial file given
with --configfile standing alone (the default trial is not merged under it).

The GPU hardware is in each trial file, so the plans do not depend on this machine. Each model's
config.json comes from tests/data/configs/ through the loopback Hub (HF_ENDPOINT), as the plan
stage fetches it before any weight byte; the loopback Hub lists no weight files, so the planner
sizes the weights from config.json and the checkpoint's quantization (labelled estimated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import DATA, REPO, free_ports, written
from hub_server import HubServer
from llmtrial.config import check_config, configuration_spec, load_config, scenario_contexts
from llmtrial.core.preflight_model import Gpus
from llmtrial.core.trial_config import HardwareBlock, PlanBlock, SourceBlock
from llmtrial.host.nodes import configuration_nodes
from llmtrial.plan.checkpoint import WeightsSize
from llmtrial.plan.plan_inputs import ServingArgs
from llmtrial.plan.planner import plan_record
from llmtrial.serve.server import vllm_flags
from llmtrial.weights.model_source import model_config_for, planned_weights
from workflow_helpers import default_config, demo_service, job_counts, snakemake, write_config

GiB = 2**30
TRIALS = REPO / "config" / "trials"
SEED_003 = TRIALS / "seed003-qwen3-235b-4gpu.yaml"
SEED_002 = TRIALS / "seed002-deepseek-v4-flash-pp3.yaml"
SEED_001 = TRIALS / "seed001-qwen2.5-7b-awq-1gpu.yaml"
SEED_000 = TRIALS / "seed000-qwen3.5-397b-fp8-pp3.yaml"  # planned in tests/plan/test_seed000.py
NO_GPUS_HERE = Gpus(present=False, count=0, devices=[])  # the trial files say what the GPUs are

#: Seed 002 publishes no config.json of its model. A stand-in with the report's shape: 43 layers,
#: 64 attention heads, and one 96-wide KV head in bf16 (384 B per token per layer), which puts the
#: KV pool of the 15,16,12 split at the report's 1,000,964 tokens. Its architecture is one the
#: planner cannot count parameters of, so the weights are the report's: 43 layers of about 3.33 GiB
#: (the real Hub lists the shards' sizes, which the plan stage uses).
SEED_002_CONFIG = {"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 43, "num_attention_heads": 64,
                   "num_key_value_heads": 1, "head_dim": 96, "hidden_size": 4096, "vocab_size": 129280,
                   "torch_dtype": "bfloat16", "max_position_embeddings": 1048576}
SEED_002_WEIGHTS = WeightsSize(int(43 * 3.33 * GiB), "given", "seed 002: 43 layers of about 3.33 GiB")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The loopback Hub holding the real config.json of the trials' Hub models (no weights)."""
    from huggingface_hub import constants

    with HubServer() as server:
        # snakemake's jobs read the environment; this process's huggingface_hub read it at import
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        for trial, name in ((SEED_003, "Qwen3-235B-A22B-Instruct-2507-FP8"), (SEED_001, "Qwen2.5-7B-Instruct-AWQ")):
            repo_id = load_config(trial)["model"]["source"]["repo_id"]
            server.add_commit(repo_id, {"config.json": (DATA / "configs" / f"{name}.json").read_bytes()})
        yield server


def plans(trial: Path) -> dict[str, dict]:
    """Every configuration's plan record, as the plan stage makes it (config.json from the Hub)."""
    config = load_config(trial)
    source, archive = SourceBlock.model_validate(config["model"]["source"]), config["model"]["weights"]["archive_dir"]
    model_config, weights = model_config_for(source, archive_dir=archive), planned_weights(source, archive)
    return {name: written(plan_record(spec=configuration_spec(check_config(config), name), model_config=model_config, weights=weights,
                                      gpus=NO_GPUS_HERE, hardware=HardwareBlock.model_validate(config["hardware"]), settings=PlanBlock.model_validate(config["plan"]),
                                      contexts=scenario_contexts(check_config(config))))
            for name in config["configurations"]}


def test_every_trial_file_is_valid_and_says_what_it_reproduces():
    files = sorted(TRIALS.glob("*.yaml"))
    assert {SEED_003, SEED_002, SEED_001, SEED_000} <= set(files)
    for path in files:
        config = load_config(path)
        assert path.read_text().startswith("# "), path  # the comments say what the trial reproduces
        if not path.name.startswith("seed"):
            continue  # a trial for this machine (the CPU sweep), run end to end by its own test
        assert config["model"]["source"]["kind"] == "hub"
        assert config["hardware"]["gpus"] and config["hardware"]["gpu_memory_gib"]
        own = {"seed000-offload-reinit"} if path == SEED_000 else set()  # the seed's own patch, none other
        assert config["services"] == {} and set(config["patches"]) == own  # nothing of the default trial


def test_seed_003_tp4_fits_with_the_logged_weights_and_kv_tokens(hub):
    tp4 = plans(SEED_003)["tp4"]
    assert tp4["verdict"] == "fits", tp4["reasons"]
    assert tp4["hardware"]["gpus"] == 4 and tp4["hardware"]["gpu_memory_gib"] == 95.01
    plan = tp4["plan"]
    assert plan["weights_kind"] == "estimated" and "FP8 (block 128x128 scales)" in plan["weights_source"]
    assert plan["weights_bytes"] / 1e9 == pytest.approx(236.45, rel=0.001)  # the seed's 24 shards: 236.45 GB
    assert plan["weights_bytes_per_rank"][0] / GiB == pytest.approx(55.19, rel=0.005)  # logged 55.19 GiB
    assert plan["kv_cache_bytes_per_token"] == 192_512  # 2 x 94 x 4 x 128 x 2, the seed's Step 2
    assert plan["kv_heads_per_rank"] == 1
    assert plan["predicted_kv_cache_tokens"] == pytest.approx(621_392, rel=0.015)  # logged 621,392
    assert plan["max_concurrency"] == pytest.approx(18.96, rel=0.015)  # logged 18.96x at 32,768
    assert {c["name"]: c["status"] for c in tp4["checks"]}["deepgemm"] == "ok"  # VLLM_USE_DEEP_GEMM=0


def test_seed_003_tp3_is_rejected_for_head_divisibility_and_the_others_plan(hub):
    planned = plans(SEED_003)
    tp3 = planned["tp3"]
    assert tp3["verdict"] == "does_not_fit" and not tp3["force"]
    assert any("Total number of attention heads (64) must be divisible by tensor parallel size (3)" in r
               for r in tp3["reasons"]), tp3["reasons"]
    assert any("KV heads (4) must be divisible by tensor parallel size (3)" in r for r in tp3["reasons"])
    ep, pp4 = planned["tp4-ep"], planned["pp4"]
    assert ep["verdict"] == "fits", ep["reasons"]
    # expert parallel moves whole experts instead of slices: no memory saved at this scale
    assert ep["plan"]["weights_bytes_per_rank"] == planned["tp4"]["plan"]["weights_bytes_per_rank"]
    assert ep["plan"]["predicted_kv_cache_tokens"] == planned["tp4"]["plan"]["predicted_kv_cache_tokens"]
    assert pp4["verdict"] == "fits", pp4["reasons"]
    assert pp4["plan"]["stage_layers"] == [23, 23, 24, 24] and pp4["plan"]["kv_heads_per_rank"] == 4
    assert all(53 * GiB < w < 57 * GiB for w in pp4["plan"]["weights_bytes_per_rank"])
    # every stage keeps all four KV heads of its layers: fewer KV tokens than TP4, as the seed found
    assert 0.85 < pp4["plan"]["predicted_kv_cache_tokens"] / planned["tp4"]["plan"]["predicted_kv_cache_tokens"] < 1


def test_seed_001_awq_fits_one_3060_with_either_kernel(hub):
    planned = plans(SEED_001)
    assert set(planned) == {"awq-marlin", "awq"}
    for name, record in planned.items():
        assert record["verdict"] == "fits", (name, record["reasons"])
        plan = record["plan"]
        assert plan["weights_kind"] == "estimated" and "AWQ" in plan["weights_source"].upper()
        assert plan["weights_bytes_per_rank"][0] / GiB == pytest.approx(5.2, abs=0.05)  # "5.2 GiB once loaded"
        assert plan["kv_cache_bytes_per_token"] == 2 * 28 * 4 * 128 * 2  # 56 KiB per token, the seed's formula
        assert plan["max_model_len"] == 4096 and plan["max_concurrency"] > 1
    assert planned["awq"]["plan"] == planned["awq-marlin"]["plan"]  # the kernel changes speed, not memory


def seed_002_plans() -> dict[str, dict]:
    config = load_config(SEED_002)
    return {name: written(plan_record(spec=configuration_spec(check_config(config), name), model_config=SEED_002_CONFIG,
                                      weights=SEED_002_WEIGHTS, gpus=NO_GPUS_HERE, hardware=HardwareBlock.model_validate(config["hardware"]),
                                      settings=PlanBlock.model_validate(config["plan"]), contexts=scenario_contexts(check_config(config))))
            for name in config["configurations"]}


def test_seed_002_pp3_with_the_recommended_split_fits_and_vllms_even_split_does_not():
    planned = seed_002_plans()
    pp3, even = planned["pp3"], planned["pp3-even"]
    assert pp3["verdict"] == "fits", pp3["reasons"]
    assert pp3["plan"]["stage_layers"] == [15, 16, 12]  # the trial's VLLM_PP_LAYER_PARTITION
    assert pp3["plan"]["pp_layer_partition"] == "15,16,12"  # and what the planner recommends
    stage = [w / GiB for w in pp3["plan"]["weights_bytes_per_rank"]]
    # the seed's measured footprint on the three cards, 51.64 / 53.76 / 52.86 GiB (the last with the draft and head)
    assert stage == pytest.approx([51.64, 53.76, 52.86], rel=0.03)
    assert all(w < 63.5 * 0.95 - 5 for w in stage)  # at least 5 GiB left for the KV cache on every GPU
    assert pp3["plan"]["predicted_kv_cache_tokens"] == pytest.approx(1_000_964, rel=0.03)  # the seed's pool
    assert pp3["plan"]["max_concurrency"] >= 1  # the 199,957-token document fits one request
    assert {c["name"]: c["status"] for c in pp3["checks"]}["allocator"] == "ok"  # expandable_segments off
    assert even["verdict"] == "does_not_fit" and even["plan"]["stage_layers"] == [14, 14, 15]
    assert any("No memory left for the KV cache on stage 2" in r and "(63.5 GiB x gpu_memory_utilization 0.95)" in r
               for r in even["reasons"]), even["reasons"]


def test_seed_002_three_cards_do_not_start_at_utilization_0_85():
    """The seed's own arithmetic: 63.5 x 0.85 leaves about 1 GiB for the KV cache on the heaviest stage."""
    config = load_config(SEED_002)
    spec = configuration_spec(check_config(config), "pp3")
    spec.args["gpu_memory_utilization"] = 0.85
    record = plan_record(spec=spec, model_config=SEED_002_CONFIG, weights=SEED_002_WEIGHTS,
                         gpus=NO_GPUS_HERE, hardware=HardwareBlock.model_validate(config["hardware"]), settings=PlanBlock.model_validate(config["plan"]),
                         contexts=scenario_contexts(check_config(config)))
    assert record.verdict == "does_not_fit"
    assert any("No memory left for the KV cache" in r for r in record.reasons), record.reasons


def test_seed_000_pins_nccl_to_one_interface_with_infiniband_off_and_offloads_only_the_experts():
    """Both configurations span the two nodes through Ray; every rank's NCCL takes its node's interface and
    no InfiniBand; the offload reaches vLLM as --cpu-offload-gb 64 --cpu-offload-params experts."""
    trial = check_config(load_config(SEED_000))
    for name in trial.configurations:
        spec = configuration_spec(trial, name)
        assert spec.launch == "ray" and list(spec.nodes) == ["a", "b"] and spec.env["NCCL_IB_DISABLE"] == "1"
        for node in configuration_nodes(trial, name):
            interface = trial.nodes[node.name].interface
            assert interface and node.rank_env()["NCCL_SOCKET_IFNAME"] == interface
        flags = vllm_flags(ServingArgs.from_config(spec.args, spec.env))
        assert {"--language-model-only", "--enforce-eager"} <= set(flags)
        assert flags[flags.index("--kv-cache-dtype") + 1] == "fp8"
        assert flags[flags.index("--pipeline-parallel-size") + 1] == "3"
    offload = vllm_flags(ServingArgs.from_config(configuration_spec(trial, "pp3-offload").args))
    assert offload[offload.index("--cpu-offload-gb") + 1] == "64"
    params = offload[offload.index("--cpu-offload-params") + 1:]
    assert params[0] == "experts" and (len(params) == 1 or params[1].startswith("--"))  # the experts alone
    assert "--cpu-offload-gb" not in vllm_flags(ServingArgs.from_config(configuration_spec(trial, "pp3-no-offload").args))


# --------------------------------------------------------------------------- through snakemake


@pytest.mark.workflow
@pytest.mark.parametrize("trial", [SEED_003, SEED_002, SEED_001, SEED_000], ids=lambda p: p.stem)
def test_each_trial_file_dry_runs_clean(tmp_path, trial):
    config = load_config(trial)
    out = snakemake(tmp_path, "-n", configfile=trial)
    assert out.returncode == 0, out.stderr[-3000:]
    n = len(config["configurations"])
    assert job_counts(out.stdout) == {"preflight": 1, "plan": n, "stage_model": 1, "quiet": 1, "patch": 1, "trial": n,
                                      "cleanup_trial": 1, "report": 1, "export": 1, "all": 1}
    for name in config["configurations"]:
        assert f"results/{config['trial']}/plans/{name}.json" in out.stdout
    assert "demo" not in out.stdout and "tiny-llama" not in out.stdout


@pytest.mark.workflow
def test_the_plan_stage_plans_seed_003_from_the_hub(hub, tmp_path):
    """The workflow's plan stage on the trial file (only the disk reserve lowered: this box has no
    200 GiB to spare, and only config.json is fetched)."""
    config = yaml.safe_load(SEED_003.read_text())
    config["disk"] = {"reserve_fraction": 0.0, "reserve_min_gib": 0.0}
    config["model"]["weights"]["archive_dir"] = str(tmp_path / "archive")
    path = tmp_path / "seed003.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    targets = [f"results/seed003-qwen3-235b/plans/{name}.json" for name in ("tp4", "tp3")]
    done = snakemake(tmp_path, "--cores", "2", *targets, configfile=path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    tp4, tp3 = (json.loads((tmp_path / t).read_text()) for t in targets)
    assert tp4["verdict"] == "fits" and tp4["plan"]["weights_bytes_per_rank"][0] / GiB == pytest.approx(55.19, rel=0.005)
    assert tp4["plan"]["predicted_kv_cache_tokens"] == pytest.approx(621_392, rel=0.015)
    assert tp3["verdict"] == "does_not_fit"
    assert any("must be divisible by tensor parallel size (3)" in r for r in tp3["reasons"])
    assert [r.path for r in hub.gets()] and all(r.path.endswith("config.json") for r in hub.gets())


@pytest.mark.workflow
def test_a_trial_file_given_with_configfile_is_the_whole_trial(tmp_path):
    """The working folder's config/config.yaml (here the default trial, its demo service on a
    free port) is not merged under a trial file given with --configfile: one configuration, no
    demo service quieted, no demo patch."""
    port = free_ports(1)[0]
    default = default_config()
    default["services"] = {"demo-web": demo_service(tmp_path / "demo-state", port)}
    write_config(tmp_path, default)
    one = {"trial": "solo", "model": {"name": "tiny", "source": {"kind": "tiny", "seed": 0}},
           "configurations": {"only": {"args": {"tensor_parallel_size": 1}}},
           "scenarios": {"c1": {"concurrency": 1, "num_prompts": 2, "input_len": 16, "output_len": 8}}}
    path = tmp_path / "solo.yaml"
    path.write_text(yaml.safe_dump(one))

    out = snakemake(tmp_path, "-n", configfile=path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert job_counts(out.stdout) == {"preflight": 1, "plan": 1, "stage_model": 1, "quiet": 1, "patch": 1, "trial": 1,
                                      "cleanup_trial": 1, "report": 1, "export": 1, "all": 1}
    assert "configuration=only" in out.stdout and "configuration=tp" not in out.stdout
    assert "results/demo" not in out.stdout and "demo-worker-log" not in out.stdout  # no demo patch input
    # the default trial itself still plans its two configurations and the demo patch
    plain = snakemake(tmp_path, "-n")
    assert job_counts(plain.stdout)["trial"] == 2 and "demo-worker-log" in plain.stdout

    # the quiet stage for real: it quiets nothing, and the demo service's status was never asked
    done = snakemake(tmp_path, "--cores", "1", "--until", "quiet", configfile=path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    quieted = json.loads((tmp_path / "results" / "solo" / "services" / "quieted.json").read_text())
    assert quieted["services"] == []
    ledger = (tmp_path / "results" / "solo" / "ledger.jsonl")
    assert "demo-web" not in (ledger.read_text() if ledger.exists() else "")


@pytest.mark.workflow
@pytest.mark.parametrize("b_reach", ["ssh", "slurm"])
def test_seed_000_dry_runs_under_the_slurm_profile(tmp_path, b_reach):
    """Under --profile profiles/slurm the host stages are one group job whose configurations ask the trial's
    3 GPUs; node b over ssh stays outside the allocation, node b as the allocation's second host (reach:
    slurm) makes it ask two nodes."""
    config = yaml.safe_load(SEED_000.read_text())
    if b_reach == "slurm":
        b = config["nodes"]["b"]
        config["nodes"]["b"] = {"reach": "slurm", **{k: b[k] for k in ("python", "staging_dir", "interface", "gpus")}}
        del config["nodes"]["a"]["address"]  # a local node of a SLURM trial: the allocation's first host
    path = tmp_path / "seed000.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = snakemake(tmp_path, "--profile", str(REPO / "profiles" / "slurm"), "-n", configfile=path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert text.count("Group job host") == 1
    trials = [line for line in text.splitlines() if "resources:" in line and "serving=1" in line]
    assert len(trials) == len(config["configurations"])
    for line in trials:
        assert f"gpu={config['hardware']['gpus']}" in line and f"runtime={config['slurm']['runtime_min']}" in line
        assert ("nodes=2" in line) == (b_reach == "slurm")
