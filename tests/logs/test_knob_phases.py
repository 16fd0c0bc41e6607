"""Which vLLM knob acts in which start-up phase (llmtrial.logs.knob_phases), against the installed vLLM.

What a user relies on: every location the table gives is a line of the function it names, in the
installed vLLM's source, and the table is for the installed version; the rules a crash's reader
applies (which knob can move which phase) read from the table; and a table with an unknown phase or
a malformed location does not load, naming the key at fault.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

import pytest
import yaml

from llmtrial.core.vllm_install import installed_vllm
from llmtrial.logs.knob_phases import TABLE, KnobPhasesError, Location, knob_phases, load_knob_phases
from llmtrial.logs.signature import PHASES


def _vllm_root() -> Path:
    """The installed ``vllm`` package's folder (found without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _functions(file: Path) -> dict[str, list[tuple[int, int]]]:
    """Each function or method the file defines (nested ones too): its ``def`` line to its last line."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.setdefault(node.name, []).append((node.lineno, node.end_lineno or node.lineno))
    return spans


def _fault(root: Path, loc: Location) -> str | None:
    """Why ``loc`` does not hold in the tree at ``root``; None where it does."""
    file = root / loc.file
    if not file.is_file():
        return "no such file"
    spans = _functions(file).get(loc.function)
    if not spans:
        return f"no function {loc.function} in the file"
    if not any(start <= loc.line <= end for start, end in spans):
        return f"line {loc.line} is outside {loc.function} (lines {', '.join(f'{s}-{e}' for s, e in spans)})"
    return None


# ------------------------------------------------------------------ the table against the installed vLLM


@pytest.mark.hostwide  # reads the installed vLLM's files, which the e2e trials' file patches change (lines move)
def test_every_location_is_a_line_of_its_function_in_the_installed_vllm():
    root = _vllm_root()
    table = knob_phases()
    faults = [f"{knob} {part}: {loc}: {fault}" for knob, part, loc in table.locations()
              if (fault := _fault(root, loc)) is not None]
    assert faults == [], "locations that do not hold in " + str(root) + ":\n" + "\n".join(faults)


def test_the_table_is_for_the_installed_vllm():
    assert knob_phases().vllm == installed_vllm().version


def test_the_location_check_names_what_does_not_hold(tmp_path: Path):
    (tmp_path / "mod.py").write_text("def outer():\n    def inner():\n        pass\n    return inner\n")
    assert _fault(tmp_path, Location.model_validate("mod.py:inner:3")) is None
    assert _fault(tmp_path, Location.model_validate("mod.py:outer:4")) is None
    assert _fault(tmp_path, Location.model_validate("mod.py:inner:4")) == "line 4 is outside inner (lines 2-3)"
    assert _fault(tmp_path, Location.model_validate("mod.py:gone:1")) == "no function gone in the file"
    assert _fault(tmp_path, Location.model_validate("other.py:outer:1")) == "no such file"


# ------------------------------------------------------------------ the rules, read from the table


@pytest.mark.parametrize(("knob", "phases"), [
    ("gpu_memory_utilization", ["device_init", "memory_profiling", "kv_allocation"]),
    ("max_num_seqs", ["memory_profiling", "graph_capture_compile", "serving"]),
    ("max_num_batched_tokens", ["memory_profiling", "graph_capture_compile", "serving"]),
    ("enforce_eager", ["graph_capture_compile"]),
    ("compilation_config", ["memory_profiling", "graph_capture_compile"]),
    ("cpu_offload_gb", ["weight_loading", "post_load_processing"]),
    ("quantization", ["weight_loading", "post_load_processing"]),
    ("kv_cache_dtype", ["kv_allocation"]),
    ("speculative_config", ["weight_loading", "serving"]),
    ("VLLM_CPU_KVCACHE_SPACE", ["device_init", "memory_profiling", "kv_allocation"]),
])
def test_a_knob_acts_in_the_phases_vllm_reads_it_in(knob: str, phases: list[str]):
    table = knob_phases()
    assert {p: table.acts(knob, p) for p in phases} == dict.fromkeys(phases, True)
    assert all(table.where(knob, p) for p in phases)


@pytest.mark.parametrize(("knob", "phases"), [
    ("gpu_memory_utilization", ["weight_loading", "post_load_processing"]),
    ("VLLM_CPU_KVCACHE_SPACE", ["weight_loading", "post_load_processing"]),
])
def test_a_knob_does_not_act_where_vllm_does_not_read_it(knob: str, phases: list[str]):
    table = knob_phases()
    assert {p: table.acts(knob, p) for p in phases} == dict.fromkeys(phases, False)
    assert [table.where(knob, p) for p in phases] == [[] for _ in phases]


def test_an_unknown_knob_is_not_in_the_table():
    table = knob_phases()
    assert table.acts("no_such_knob", "device_init") is None
    assert table.where("no_such_knob", "device_init") == []


def test_a_misspelt_phase_is_refused_not_read_as_no():
    with pytest.raises(ValueError, match="'weight_load' is not a phase"):
        knob_phases().acts("gpu_memory_utilization", "weight_load")  # type: ignore[arg-type]


def test_every_knob_says_why_not_elsewhere_and_arguments_and_variables_are_told_apart():
    table = knob_phases()
    assert all(k.not_in.strip() and k.acts_in for k in table.knobs.values())
    assert {name for name, k in table.knobs.items() if k.kind == "env"} == {"VLLM_CPU_KVCACHE_SPACE",
                                                                            "VLLM_CPU_OMP_THREADS_BIND"}
    assert {p for k in table.knobs.values() for p in k.acts_in} <= set(PHASES)


def test_a_location_reads_back_as_written():
    loc = Location.model_validate("v1/worker/gpu_worker.py:init_device:535")
    assert (loc.file, loc.function, loc.line) == ("v1/worker/gpu_worker.py", "init_device", 535)
    assert str(loc) == "v1/worker/gpu_worker.py:init_device:535"
    assert loc.model_dump() == "v1/worker/gpu_worker.py:init_device:535"


def test_the_shipped_table_loads_through_the_path_loader_as_the_cached_one():
    assert load_knob_phases(TABLE) == knob_phases()
    assert knob_phases() is knob_phases()


# ------------------------------------------------------------------ a bad table


def _bad_copy(tmp_path: Path, change) -> Path:
    """The shipped table with ``change`` applied to its data, written to ``tmp_path``."""
    data = yaml.safe_load(TABLE.read_text(encoding="utf-8"))
    change(data)
    path = tmp_path / "knob_phases.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_an_unknown_phase_fails_loading_naming_the_key(tmp_path: Path):
    def rename(data):
        acts_in = data["knobs"]["max_num_seqs"]["acts_in"]
        acts_in["weight_load"] = acts_in.pop("serving")

    path = _bad_copy(tmp_path, rename)
    with pytest.raises(KnobPhasesError) as err:
        load_knob_phases(path)
    assert str(path) in str(err.value)
    assert "knobs.max_num_seqs.acts_in.weight_load" in str(err.value)


@pytest.mark.parametrize("bad", ["v1/worker/gpu_worker.py:init_device", "v1/worker/gpu_worker.py:init_device:x",
                                 "init_device:535", "v1/worker/gpu_worker.py:init_device:0"])
def test_a_malformed_location_fails_loading_naming_the_key(tmp_path: Path, bad: str):
    def spoil(data):
        data["knobs"]["dtype"]["acts_in"]["weight_loading"][0] = bad

    with pytest.raises(KnobPhasesError, match=r"knobs\.dtype\.acts_in\.weight_loading\.0"):
        load_knob_phases(_bad_copy(tmp_path, spoil))


def test_an_unknown_key_or_an_unreadable_file_fails_loading_naming_it(tmp_path: Path):
    def extra(data):
        data["knobs"]["dtype"]["phases"] = []

    with pytest.raises(KnobPhasesError, match=r"knobs\.dtype\.phases"):
        load_knob_phases(_bad_copy(tmp_path, extra))
    broken = tmp_path / "broken.yaml"
    broken.write_text("knobs: [\n", encoding="utf-8")
    with pytest.raises(KnobPhasesError, match="broken.yaml"):
        load_knob_phases(broken)
