"""The engine's own warnings: each found with its line and line number, none in the real CPU logs.

Lines are the seeds' where they quote them, else real log lines from public reports (cited), else
the message as the installed vLLM 0.32.0 source formats it (file and line cited) under the prefix
vLLM prints.
"""

from __future__ import annotations

import pytest
import yaml

from conftest import DATA
from llmtrial.logs.engine_warnings import WARNINGS, engine_warnings
from llmtrial.logs.lines import read_log

#: Seed 001 (lesson on splitting, quantizing, offloading): the engine's line, quoted over three
#: lines on the page, one line in the log.
SEED_AWQ = ("Detected that the model can run with awq_marlin, however you specified quantization=awq explicitly, "
            "so forcing awq. Use quantization=awq_marlin for faster inference")
#: Seed 001: "Custom allreduce is disabled because your platform lacks GPU P2P capability."
SEED_P2P = "Custom allreduce is disabled because your platform lacks GPU P2P capability."

#: A real vLLM log on GitHub (vllm/model_executor/layers/quantization/awq_marlin.py, logger.info).
AWQ_LINE = ("(APIServer pid=376429) INFO 02-23 16:58:32 [awq_marlin.py:166] Detected that the model can run with "
            "awq_marlin, however you specified quantization=awq explicitly, so forcing awq. Use "
            "quantization=awq_marlin for faster inference")
#: A real vLLM 0.6.3.post1 log on GitHub (gptq_marlin.py's twin of the awq line).
GPTQ_LINE = ("INFO 02-19 10:54:09 gptq_marlin.py:111] Detected that the model can run with gptq_marlin, however you "
             "specified quantization=gptq explicitly, so forcing gptq. Use quantization=gptq_marlin for faster inference")
#: Real vLLM logs on GitHub: fused_moe.py's warning when no tuned config exists, as a Python list
#: (0.10-era, two ranks on one line) and as one path (0.2x).
MOE_LIST = ("(Worker_TP2_EP2 pid=2080) (Worker_TP6_EP6 pid=2084) WARNING 09-24 20:53:34 [fused_moe.py:727] Using "
            "default MoE config. Performance might be sub-optimal! Config file not found at ['/workspace/.venv/lib/"
            "python3.12/site-packages/vllm/model_executor/layers/fused_moe/configs/E=16,N=1536,device_name=NVIDIA_L40S,"
            "dtype=fp8_w8a8,block_shape=[128,128].json']")
MOE_PATH = ("(EngineCore pid=310) WARNING 06-01 21:42:14 [fused_moe.py:1071] Using default MoE config. Performance "
            "might be sub-optimal! Config file not found at /usr/local/lib/python3.12/dist-packages/vllm/"
            "model_executor/layers/fused_moe/configs/E=256,N=512,device_name=NVIDIA_GB10.json")
#: vllm/model_executor/layers/fused_moe/fused_moe.py:1163 (0.32.0): the user's folder and vLLM's, ", "-joined.
MOE_032 = ("(Worker_TP0 pid=770) WARNING 12-01 10:00:00 [fused_moe.py:1163] Using default MoE config. Performance "
           "might be sub-optimal! Config file not found at /tuned/E=128,N=768,device_name=NVIDIA_H200.json, "
           "/venv/vllm/model_executor/layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json")
#: vllm/distributed/device_communicators/custom_all_reduce.py:286-290 (0.32.0), one line per TP rank.
P2P_032 = ("(Worker_TP{r} pid=77{r}) WARNING 12-01 10:00:01 [custom_all_reduce.py:286] Custom allreduce is disabled "
           "because your platform lacks GPU P2P capability or P2P test failed. To silence this warning, specify "
           "disable_custom_all_reduce=True explicitly.")
#: custom_all_reduce.py:271-275 and :215-220 (0.32.0).
PCIE_032 = ("(Worker_TP0 pid=770) WARNING 12-01 10:00:01 [custom_all_reduce.py:271] Custom allreduce is disabled "
            "because it's not supported on more than two PCIe-only GPUs. To silence this warning, specify "
            "disable_custom_all_reduce=True explicitly.")
WORLD_032 = ("(Worker_TP0 pid=770) WARNING 12-01 10:00:01 [custom_all_reduce.py:215] Custom allreduce is disabled due "
             "to an unsupported world size: 3. Supported world sizes: [2, 4, 6, 8]. To silence this warning, specify "
             "disable_custom_all_reduce=True explicitly.")
#: custom_all_reduce.py:192 (0.32.0): INFO on a build without the library (the CPU build): not a warning.
NO_LIBRARY = ("(Worker_TP0 pid=770) INFO 12-01 10:00:01 [custom_all_reduce.py:192] Custom allreduce is disabled "
              "because of missing custom allreduce library")
#: NCCL's own lines under NCCL_DEBUG=INFO (src/init.cc INFO(NCCL_INIT, "Using network %s"), both ranks),
#: from a real two-GPU log on GitHub.
NCCL_SOCKET = ["3767c65d25c4:880:887 [0] NCCL INFO NET/IB : No device found.",
               "3767c65d25c4:880:887 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>",
               "3767c65d25c4:880:887 [0] NCCL INFO Using network Socket",
               "3767c65d25c4:880:888 [1] NCCL INFO Using network Socket"]


def _log(*lines: str) -> str:
    return "INFO 12-01 09:59:59 [api_server.py:1] vLLM API server version 0.32.0\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("line", "name", "says"),
    [
        (SEED_AWQ, "slower_quant_kernel", "vLLM warned awq could run as awq_marlin"),
        (AWQ_LINE, "slower_quant_kernel", "vLLM warned awq could run as awq_marlin"),
        (GPTQ_LINE, "slower_quant_kernel", "vLLM warned gptq could run as gptq_marlin"),
        (MOE_LIST, "untuned_moe_config",
         "(E=16,N=1536,device_name=NVIDIA_L40S,dtype=fp8_w8a8,block_shape=[128,128].json)"),
        (MOE_PATH, "untuned_moe_config", "(E=256,N=512,device_name=NVIDIA_GB10.json)"),
        (MOE_032, "untuned_moe_config", "(E=128,N=768,device_name=NVIDIA_H200.json)"),
        (SEED_P2P, "custom_allreduce_disabled", "(because your platform lacks GPU P2P capability)"),
        (P2P_032.format(r=0), "custom_allreduce_disabled", "(because your platform lacks GPU P2P capability"),
        (PCIE_032, "custom_allreduce_disabled", "(because it's not supported on more than two PCIe-only GPUs)"),
        (WORLD_032, "custom_allreduce_disabled", "(due to an unsupported world size: 3)"),
        (NCCL_SOCKET[2], "nccl_socket_transport", "TCP sockets"),
    ],
)
def test_each_warning_is_found_with_its_line_and_line_number(line, name, says):
    found = engine_warnings(_log("INFO 12-01 10:00:00 [x.py:1] something else", line), source="configs/tp2/server.log")
    assert [w.name for w in found] == [name]
    w = found[0]
    assert w.line == line and w.source == "configs/tp2/server.log:3"
    assert says in w.summary and w.kind == "measured" and w.count == 1
    assert w.advice.endswith(".")


def test_the_advice_names_the_faster_kernel_and_the_seeds_measurement():
    (w,) = engine_warnings(GPTQ_LINE)
    assert "quantization=gptq_marlin" in w.advice and "10.4 times" in w.advice


def test_custom_allreduce_off_for_want_of_p2p_gets_the_seeds_advice_and_for_other_reasons_nccls():
    (p2p,) = engine_warnings(SEED_P2P)
    (pcie,) = engine_warnings(PCIE_032)
    assert p2p.name == pcie.name == "custom_allreduce_disabled"
    assert "nvidia-smi topo -p2p r" in p2p.advice and "NCCL" in pcie.advice and "nvidia-smi" not in pcie.advice


CORPUS_WARNED = sorted(p for p in (DATA / "vllm-logs").glob("*.yaml") if "warnings" in yaml.safe_load(p.read_text()))


@pytest.mark.parametrize("case", CORPUS_WARNED, ids=[p.stem for p in CORPUS_WARNED])
def test_the_warnings_real_logs_from_public_threads_show_are_read_with_their_line(case):
    """tests/data/vllm-logs: each case's ``warnings`` as its reader wrote them (name, line) are what is found."""
    want = [(w["name"], f"{case.stem}.log:{w['line']}") for w in yaml.safe_load(case.read_text())["warnings"]]
    found = engine_warnings(read_log(case.with_suffix(".log")), source=f"{case.stem}.log")
    assert [(w.name, w.source) for w in found] == want


def test_ranks_printing_the_same_warning_make_one_entry_with_a_count_and_the_first_line():
    text = _log(P2P_032.format(r=0), P2P_032.format(r=1), *NCCL_SOCKET, "\x1b[33m" + MOE_PATH + "\x1b[0m")
    found = engine_warnings(text)
    assert [(w.name, w.count, w.source) for w in found] == [
        ("custom_allreduce_disabled", 2, "server.log:2"), ("nccl_socket_transport", 2, "server.log:6"),
        ("untuned_moe_config", 1, "server.log:8")]
    assert found[0].process == "Worker_TP0" and found[0].line == P2P_032.format(r=0)
    assert found[2].line == MOE_PATH  # colour codes stripped


def test_lines_that_only_look_alike_are_not_warnings():
    assert engine_warnings(_log(NO_LIBRARY, "3767c65d25c4:880:887 [0] NCCL INFO Using network IB",
                                "NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>")) == []
    assert engine_warnings("") == []


@pytest.mark.parametrize("log", sorted(p.name for p in DATA.glob("vllm-0.32.0-cpu-*.log")
                                       if p.name != "vllm-0.32.0-cpu-tp2-server.log"))
def test_the_real_cpu_logs_that_compiled_nothing_have_none(log):
    assert engine_warnings(read_log(DATA / log)) == []


def test_a_compile_cache_that_could_not_be_loaded_is_a_warning_with_its_reason_once_per_start_up():
    """The real CPU tp2 start-up on this project's machine (tests/data): both workers found the AOT-compiled model
    in vLLM's cache, could not load it, and compiled again (lines 63 and 64)."""
    [w] = engine_warnings(read_log(DATA / "vllm-0.32.0-cpu-tp2-server.log"), source="configs/tp2/server.log")
    assert (w.name, w.count, w.source, w.process) == ("compile_cache_load_failure", 2, "configs/tp2/server.log:63",
                                                       "Worker_TP1")
    assert w.summary == ("vLLM could not load the compiled model from its compile cache and compiled it again "
                         "('function' object has no attribute 'finalize_loading')")
    assert "compile phase" in w.advice


def test_the_warnings_are_named_once():
    names = [w.name for w in WARNINGS]
    assert len(names) == len(set(names)) == 5
