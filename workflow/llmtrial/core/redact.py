"""Secrets kept out of records, logs and the report: the values of secret-looking names
(tokens, passwords, API keys) in an environment, a command line or a configuration become
``<redacted>``.
"""

from __future__ import annotations

import re
from typing import Any

#: Environment variable names whose values never reach a record, a log or the report.
_SECRET_WORDS = r"TOKEN|SECRET|PASSWORD|PASSWD|API[_-]?KEY|CREDENTIAL"
SECRET_NAME = re.compile(_SECRET_WORDS, re.IGNORECASE)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment for records: values of secret-looking names replaced by ``<redacted>``."""
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}


#: ``name=value`` or ``name: value`` inside one argument, where the name looks secret.
_SECRET_PAIR = re.compile(
    rf"(?P<key>[\w.-]*(?:{_SECRET_WORDS})[\w.-]*['\"]?\s*[:=]\s*)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;}\]]+)", re.IGNORECASE)
_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?")
REDACTED = "<redacted>"


def _redact_pair(m: re.Match[str]) -> str:
    # a number is a setting (max_tokens=32), never a secret worth hiding
    return m[0] if _NUMBER.fullmatch(m["value"]) else m["key"] + REDACTED


def redact_argv(argv: list[str]) -> list[str]:
    """A command line for records: the value of every secret-looking name replaced by
    ``<redacted>``, whether it follows in the same argument (``hf_token=abc``,
    ``--hf-token=abc``, ``serving={env: {HF_TOKEN: abc}}``) or is the next one
    (``--hf-token abc``). Numbers are kept (``max_tokens=32``)."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("-") and "=" not in arg and SECRET_NAME.search(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(_SECRET_PAIR.sub(_redact_pair, arg))
    return out


def redact_config(value: Any) -> Any:
    """A configuration (or any JSON-like value) for records: under a secret-looking key, a
    value that is not a number or a boolean is ``<redacted>``; lists of strings (argv) are
    redacted as command lines."""
    if isinstance(value, dict):
        return {k: (REDACTED if SECRET_NAME.search(str(k)) and not isinstance(v, (int, float, bool)) and v is not None
                    else redact_config(v)) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [redact_config(v) for v in value]
    return value
