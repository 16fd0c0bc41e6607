"""The ``llmtrial`` command: the parts a person wants without a workflow run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llmtrial.joblog import open_job_log


def _parse_log(args: argparse.Namespace) -> int:
    from llmtrial.logs import diagnose_failure, parse_startup, read_log

    text = read_log(args.log)
    out = {"startup": parse_startup(text, source=args.log), "failure": diagnose_failure(text, source=args.log)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, f in out["startup"].items():
        unit = f" {f['unit']}" if f.get("unit") else ""
        print(f"{name:38} {f['value']}{unit}    ({f['source']})")
    if out["failure"]:
        e = out["failure"]
        print(f"\nfailure ({e['pattern']}) at {e['source']}:\n  {e['line']}\n  {e['diagnosis']}")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from llmtrial.cleanup import run_cleanup
    from llmtrial.records import write_record

    results = Path(args.results_dir)
    record = run_cleanup(results, ports=args.port, host=args.host, stop_timeout=args.stop_timeout)
    write_record(results / "cleanup" / "on-demand.json", record)
    for s in record["servers"]:
        print(f"server {s['label']} (pgid {s['pgid']}, port {s['port']}): {s['action']}")
    for r in record["residues"]:
        print(f"RESIDUE {r['kind']}: {r['what']}: {r['seen']}")
    print("host restored" if record["restored"] else "host NOT fully restored")
    return 0 if record["restored"] else 1


def _validate(args: argparse.Namespace) -> int:
    from llmtrial.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{args.config}: valid; trial {config['trial']!r}, configurations {', '.join(config['configurations'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrial", description="Serving trials of LLMs with vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("parse-log", help="startup facts and failure diagnosis from a vLLM server log")
    p.add_argument("log")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_parse_log)

    p = sub.add_parser("cleanup", help="give the host back from a trial's ledger (idempotent)")
    p.add_argument("results_dir", help="results/<trial>")
    p.add_argument("--port", type=int, action="append", default=[], help="a trial port to check (repeatable)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--stop-timeout", type=float, default=30.0)
    p.set_defaults(func=_cleanup)

    p = sub.add_parser("validate", help="check a trial configuration file against the schema")
    p.add_argument("config")
    p.set_defaults(func=_validate)

    args = parser.parse_args(argv)
    open_job_log(None)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
