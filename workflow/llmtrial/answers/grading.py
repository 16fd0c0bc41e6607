"""Graders: does an answer give the expected one?

``exact``
    The answer, stripped of surrounding white space, is the expected text.
``number``
    The last number in the answer equals the expected number: thousands separators
    (``6,106``), a trailing full stop and surrounding words are ignored, so "6,106." and
    "71 * 86 = 6106" both give 6106.
``contains``
    The expected text occurs in the answer, ignoring case.
``regex``
    The expected text is a regular expression that matches somewhere in the answer.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["GRADERS", "last_number", "grade"]

GRADERS = ("exact", "number", "contains", "regex")

# A number: an optional sign, digits with optional thousands separators, an optional fraction.
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def last_number(text: str) -> Decimal | None:
    """The last number written in ``text`` (separators dropped), or None when it has none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", "").replace("−", "-"))
    except InvalidOperation:
        return None


def grade(answer: str, expected: str, grader: str) -> bool:
    """Whether ``answer`` gives ``expected`` under ``grader`` (one of :data:`GRADERS`)."""
    if grader == "exact":
        return answer.strip() == expected.strip()
    if grader == "number":
        want, got = last_number(expected), last_number(answer)
        return want is not None and got is not None and got == want
    if grader == "contains":
        return expected.strip().casefold() in answer.casefold()
    if grader == "regex":
        return re.search(expected, answer) is not None
    raise ValueError(f"unknown grader {grader!r}; expected one of {', '.join(GRADERS)}")
