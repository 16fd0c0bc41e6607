"""On a node of a multi-node configuration: ``vllm serve <model> <flags>`` without the ``vllm``
command (vLLM 0.32's own CLI code, unchanged), run as ``python -c <this file> MODEL FLAGS...`` with
the node's Python, which has vLLM. vLLM's workers are spawned: the entry stays under the
``__main__`` guard."""

from __future__ import annotations

import sys


def serve(argv: list) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    serve(sys.argv[1:])
