"""The ``llmtrial`` command: the parts a person wants without a workflow run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llmtrial.compare.comparison import compare_trials
from llmtrial.compare.page import write_comparison
from llmtrial.compare.reproduce import reproduce
from llmtrial.compare.trials import TrialFolderError
from llmtrial.config import ConfigError, load_config
from llmtrial.core.comparison_model import ComparisonRecord
from llmtrial.core.configuration_spec import ServingSpec
from llmtrial.core.joblog import open_job_log
from llmtrial.core.record_models import PlanRecord
from llmtrial.core.records import as_written
from llmtrial.core.trial_config import HardwareBlock, PlanBlock
from llmtrial.core.units import GiB
from llmtrial.export.against import compare_against, is_trial
from llmtrial.export.br_validate import ReportInvalid
from llmtrial.export.exports import export_trial
from llmtrial.export.reports import CONVERTERS, ReportsError
from llmtrial.host.slurm_hosts import srun_options
from llmtrial.lifecycle.cleanup import cleanup_with_record
from llmtrial.logs.engine_warnings import engine_warnings
from llmtrial.logs.failures import diagnose_failure
from llmtrial.logs.lines import read_log
from llmtrial.logs.startup_log import parse_startup
from llmtrial.patch.patching import PATCHES_DIR, check_patches
from llmtrial.plan.checkpoint import WeightsSize
from llmtrial.plan.planner import plan_record
from llmtrial.plan.shape import PlanError, read_model_config
from llmtrial.weights.model_source import weights_size


def _parse_log(args: argparse.Namespace) -> int:
    text = read_log(args.log)
    warnings = engine_warnings(text, source=args.log)
    out = {"startup": parse_startup(text, source=args.log), "engine_warnings": [w.model_dump() for w in warnings],
           "failure": diagnose_failure(text, source=args.log)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, f in out["startup"].items():
        unit = f" {f['unit']}" if f.get("unit") else ""
        print(f"{name:38} {f['value']}{unit}    ({f['source']})")
    for w in warnings:
        print(f"\nwarning ({w.name}) at {w.source}: {w.summary}\n  {w.advice}")
    if out["failure"]:
        e = out["failure"]
        print(f"\nfailure ({e['pattern']}) at {e['source']}:\n  {e['line']}\n  {e['diagnosis']}")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    record = cleanup_with_record(Path(args.results_dir), args.record, ports=args.port, host=args.host,
                                 stop_timeout=args.stop_timeout, weights=not args.keep_weights,
                                 submit=srun_options(args.partition, args.account), elsewhere_too=not args.here_only)
    for s in record.servers:
        print(f"server {s.label} (pgid {s.pgid}, port {s.port}): {s.action}")
    for g in record.groups:
        print(f"group {g['label']} on node {g['node']} (pgid {g.get('pgid')}): {g['action']}")
    if not record.weights.applied:
        print(f"weights: {record.weights.reason}")
    for w in record.weights.folders:
        print(f"weights {w.path}: {w.action} ({w.policy}), {w.freed_bytes or 0:,} bytes freed")
    for r in record.residues:
        print(f"RESIDUE {r.kind}: {r.what}: {r.seen}")
    print("host restored" if record.restored else "host NOT fully restored")
    return 0 if record.restored else 1


def _patches(args: argparse.Namespace) -> int:
    items = check_patches(args.name or None, patches_dir=Path(args.patches_dir) if args.patches_dir else PATCHES_DIR)
    pristine = True
    for p in items:
        print(f"{p['name']}: vLLM {p['vllm_range']} ({'in range' if p['version_ok'] else 'NOT in range'}: "
              f"{p['installed']}), flag {p['flag']}")
        for f in p["files"]:
            pristine &= f["matches"]
            print(f"  {f['file']}: {'matches RECORD' if f['matches'] else 'DOES NOT MATCH RECORD'} ({f['hash']})")
        if p["dry_run"] is not None:
            print(f"  diff: {p['dry_run']}")
    return 0 if pristine else 1


def _validate(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{args.config}: valid; trial {config['trial']!r}, configurations {', '.join(config['configurations'])}")
    return 0


def _set_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _plan_record(args: argparse.Namespace) -> PlanRecord:
    """The plan record the plan rule would write, from the command line's figures."""
    sets = _set_pairs(args.set)
    env = {k: v for k, v in sets.items() if k.startswith("VLLM_")}
    if args.cpu_kv_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{args.cpu_kv_space_gib:g}"
    model_dir = Path(args.model_config)
    if args.weights_gib:
        weights = WeightsSize(int(args.weights_gib * GiB), "given", "given on the command line (--weights-gib)")
    else:  # the weight files beside the config, else an estimate from config.json
        weights = weights_size(model_dir if model_dir.is_dir() else model_dir.parent)
    return plan_record(
        spec=ServingSpec(name="command line", args={k: v for k, v in sets.items() if k not in env}, env=env),
        model_config=read_model_config(args.model_config), weights=weights, gpus=None,
        hardware=HardwareBlock(gpus=args.gpus, gpu_memory_gib=args.gpu_memory_gib),
        settings=PlanBlock(last_stage_extra_gib=args.last_stage_extra_gib, pinned_last_layers=args.pinned_last_layers,
                           non_torch_gib=args.non_torch_gib, peak_activation_gib=args.peak_activation_gib,
                           cuda_graph_gib=args.cuda_graph_gib),
        contexts=args.context or None, available_kv_gib=args.available_kv_gib)


def _plan_rows(record: PlanRecord) -> list[tuple[str, str]]:
    d, f = record.plan, record.facts
    rows = [("verdict", record.verdict)]
    w = f.get("weights_bytes")
    if w:
        rows.append(("weights", (f"{w.value / GiB:,.2f} GiB" if w.value is not None else "unknown") +
                     f" ({w.kind}: {w.source})"))
    if not d:
        return rows
    rows += [
        ("TP x PP", f"{d['tensor_parallel_size']} x {d['pipeline_parallel_size']} (layers per stage {d['stage_layers']})"),
        ("weights per rank", ", ".join(f"{x / GiB:,.2f} GiB" for x in d["weights_bytes_per_rank"])),
    ]
    if any(f["offload_bytes_per_rank"].value):
        rows.append(("offloaded per rank", ", ".join(f"{x / GiB:,.2f} GiB" for x in f["offload_bytes_per_rank"].value)))
    for key, label in (("gpu_budget_bytes", "GPU budget per rank"), ("non_torch_bytes", "non-torch memory"),
                       ("peak_activation_bytes", "peak activation"), ("cuda_graph_bytes", "CUDA graph memory"),
                       ("cuda_graph_outside_bytes", "CUDA graphs outside the budget"),
                       ("sampler_warmup_bytes", "sampler warm-up outside the budget"),
                       ("headroom_bytes", "headroom outside the budget")):
        if key in f:
            rows.append((label, f"{f[key].value / GiB:,.2f} GiB ({f[key].kind}: {f[key].source})"))
    rows += [
        ("KV bytes per token", f"{d['kv_cache_bytes_per_token']:,} B"),
        ("KV bytes per token per rank", f"{d['kv_cache_bytes_per_token_per_rank']} B"),
        ("KV memory per rank", ", ".join(f"{a / GiB:,.2f} GiB" for a in d["available_kv_bytes_per_rank"])
         + f" ({f['available_kv_bytes_per_rank'].kind})"),
        ("KV cache tokens", f"{d['predicted_kv_cache_tokens']:,} (block size {d['block_size']})"),
        (f"max concurrency at {d['max_model_len']:,}", f"{d['max_concurrency']:.2f}x"),
        ("preemption boundary", ", ".join(f"{n} requests of {c} tokens" for c, n in d["preemption_boundary"].items())),
        ("recommended VLLM_PP_LAYER_PARTITION", d["pp_layer_partition"] or "(PP=1)"),
    ]
    return rows


def _plan(args: argparse.Namespace) -> int:
    try:
        record = _plan_record(args)
    except PlanError as exc:
        print(f"llmtrial plan: {exc}", file=sys.stderr)
        return 2
    if args.json:  # the record, with the plan's figures at the top level
        written = as_written(record)
        print(json.dumps({k: v for k, v in written.items() if k != "plan"} | written["plan"], indent=2))
        return 0 if record.verdict != "does_not_fit" else 1
    rows = _plan_rows(record)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for reason in record.reasons:
        print(f"- {reason}")
    for c in record.checks:
        if c.status in ("warn", "fail"):
            print(f"! {c.name} ({c.status}): {c.detail}")
    return 0 if record.verdict != "does_not_fit" else 1


def _print_comparison(record: ComparisonRecord, paths: tuple[Path, Path] | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps(as_written(record), indent=2))
        return
    print(f"B {record.b.trial} ({record.b.folder}) against A {record.a.trial} ({record.a.folder})")
    print(record.method)
    print("workloads match" if record.workloads_match else "WORKLOADS DIFFER: verdicts they touch are not comparable")
    for d in record.differences:
        print(f"  {d.effect}: {d.key}: {d.a} in A, {d.b} in B" + (f" ({d.scope})" if d.scope else ""))
    for line in record.sentences:
        print(f"- {line}")
    if paths:
        print(f"record {paths[0]}\npage {paths[1]}")


def _compare(args: argparse.Namespace) -> int:
    try:
        if is_trial(args.a) and is_trial(args.b) and not (args.configuration or args.scenario):
            record = compare_trials(args.a, args.b, level=args.level)
        else:
            record = compare_against(args.a, args.b, level=args.level, tool=args.tool,
                                     configuration=args.configuration, scenario=args.scenario)
        paths = None if args.no_write else write_comparison(record, Path(args.out) if args.out else None)
    except (TrialFolderError, ReportsError, ValueError) as exc:
        print(f"llmtrial compare: {exc}", file=sys.stderr)
        return 2
    _print_comparison(record, paths, args.json)
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    try:
        status, new, found = reproduce(args.results_dir, workdir=Path(args.directory), name=args.as_name,
                                       anyway=args.anyway, cores=args.cores)
    except (TrialFolderError, ValueError) as exc:
        print(f"llmtrial reproduce: {exc}", file=sys.stderr)
        return 2
    for m in found:
        print(f"{'differs' if args.anyway else 'DIFFERS'}: {m}", file=sys.stderr)
    if new is None:
        print("llmtrial reproduce: not rerun; give --anyway to rerun here all the same", file=sys.stderr)
        return status
    if status != 0:
        print(f"llmtrial reproduce: the rerun into {new} failed (snakemake exited {status})", file=sys.stderr)
        return status
    record = compare_trials(args.results_dir, new)
    _print_comparison(record, write_comparison(record), False)
    return 0


def _export(args: argparse.Namespace) -> int:
    try:
        lines = export_trial(args.results_dir, args.out)
    except (TrialFolderError, ReportInvalid) as exc:
        print(f"llmtrial export: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


def add_comparison_commands(sub: argparse._SubParsersAction) -> None:
    """``compare`` and ``reproduce``: trial against trial."""
    p = sub.add_parser("compare", help=(
        "two trials' results folders, or a trial against another tool's runs (Benchmark Reports v0.2, or result "
        "files of vllm bench, GuideLLM, AIPerf or inference-perf): what differs, and each figure's verdict"))
    p.add_argument("a", help=("a results folder (results/<trial>), or a report file or folder of them; of two "
                              "trials the earlier is A, otherwise A is this one"))
    p.add_argument("b", help=("the other side; the comparison is written under the later trial's folder, or "
                              "under the trial's where the other side is reports"))
    p.add_argument("--level", type=float, help="confidence level (default: the later trial's statistics.level)")
    p.add_argument("--tool", choices=sorted(CONVERTERS),
                   help="the tool of a result file that is not recognised by its keys")
    p.add_argument("--configuration", help=("compare only the workloads of this configuration (tp1), on each side "
                                            "that has one of that name"))
    p.add_argument("--scenario", help=("compare only the workloads of this scenario (c1, or a report's load: c4), on "
                                       "each side that has one of that name"))
    p.add_argument("--out", help="the folder the record and page go to (needed where neither side is a trial)")
    p.add_argument("--json", action="store_true", help="print the comparison record")
    p.add_argument("--no-write", action="store_true", help="print only; write no record or page")
    p.set_defaults(func=_compare)

    p = sub.add_parser("reproduce", help="rerun a trial from its results folder's provenance, then compare the two")
    p.add_argument("results_dir", help="results/<trial> of the trial to rerun")
    p.add_argument("--as", dest="as_name", help="the new trial's name (default: <trial>-reproduced)")
    p.add_argument("--directory", default=".", help="snakemake's working directory (results/ lies under it)")
    p.add_argument("--cores", default="all", help="snakemake's --cores")
    p.add_argument("--anyway", action="store_true",
                   help="rerun even where the project's commit, vLLM's version or the host differs from the original")
    p.set_defaults(func=_reproduce)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrial", description="Serving trials of LLMs with vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("parse-log", help="startup facts, the engine's warnings and failure diagnosis from a vLLM server log")
    p.add_argument("log")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_parse_log)

    p = sub.add_parser("cleanup", help="give the host back from a trial's ledger (idempotent)")
    p.add_argument("results_dir", help="results/<trial>")
    p.add_argument("--port", type=int, action="append", default=[], help="a trial port to check (repeatable)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--stop-timeout", type=float, default=30.0)
    p.add_argument("--keep-weights", action="store_true",
                   help="do not apply the staged weights' policy (archive or delete) this time")
    p.add_argument("--record", type=Path, help="where to write the cleanup record (default <results>/cleanup/on-demand.json)")
    p.add_argument("--partition", help="SLURM: the partition of the node the ledger names, for srun")
    p.add_argument("--account", help="SLURM: the account to send the cleanup to that node under, for srun")
    p.add_argument("--here-only", action="store_true",
                   help="undo only the changes this host made, sending none to other nodes (what a cleanup sends to a node)")
    p.set_defaults(func=_cleanup)

    p = sub.add_parser("plan", help="will it fit? memory arithmetic before launch")
    p.add_argument("--model-config", required=True, help="config.json, or a model folder")
    p.add_argument("--gpus", type=int, default=0, help="GPUs (0: a CPU host)")
    p.add_argument("--gpu-memory-gib", type=float, help="usable memory per GPU")
    p.add_argument("--cpu-kv-space-gib", type=float, help="VLLM_CPU_KVCACHE_SPACE per worker (CPU host)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a vLLM arg (tensor_parallel_size=4) or VLLM_PP_LAYER_PARTITION=...; repeatable")
    p.add_argument("--available-kv-gib", type=float, help="vLLM's logged Available KV cache memory, per rank")
    p.add_argument("--weights-gib", type=float,
                   help="weight size (labelled given); default: the weight files beside the config, else an "
                        "estimate from config.json and its quantization_config")
    p.add_argument("--non-torch-gib", type=float, help="non-torch GPU memory per rank (default: the planner's rule)")
    p.add_argument("--peak-activation-gib", type=float, help="peak activation per rank (default: the planner's rule)")
    p.add_argument("--cuda-graph-gib", type=float, help="CUDA graph memory per rank (default: the planner's rule)")
    p.add_argument("--context", type=int, action="append", default=[], help="context length for the preemption boundary")
    p.add_argument("--last-stage-extra-gib", type=float, default=0.0, help="memory only on the last PP stage (draft module)")
    p.add_argument("--pinned-last-layers", type=int, default=0, help="layers that must sit on the last PP stage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_plan)

    p = sub.add_parser("patches", help="the vLLM patches: version range, target files against RECORD, dry run")
    p.add_argument("name", nargs="*", help="patches to check (default: every folder of workflow/llmtrial/patches)")
    p.add_argument("--patches-dir", help="folder of patches (default: workflow/llmtrial/patches)")
    p.set_defaults(func=_patches)

    add_comparison_commands(sub)

    p = sub.add_parser("export", help="a trial's records as llm-d's Benchmark Report v0.2, per configuration x scenario")
    p.add_argument("results_dir", help="results/<trial> of a finished trial")
    p.add_argument("--out", type=Path, help="the folder to write under (default <results>/exports)")
    p.set_defaults(func=_export)

    p = sub.add_parser("validate", help="check a trial configuration file against the schema")
    p.add_argument("config")
    p.set_defaults(func=_validate)

    args = parser.parse_args(argv)
    open_job_log(None)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
