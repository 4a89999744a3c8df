"""Whether two LaTeX answers are the same: Hugging Face's math-verify, which parses both to sympy and
compares them as numbers, expressions, intervals, sets or equations, as open evaluation suites grade
MATH-500.

Two spellings that MATH's own references use are read before math-verify sees them: `\\sqrt 13` (no
braces) is the root of 13, as MATH's normaliser reads it (plain LaTeX would take the 1 alone), a
repeating decimal `4.\\overline{6}` is the fraction it stands for (14/3), and a sentence's full stop
after the answer is not part of it.

math-verify bounds each parse and comparison with `signal.alarm`, which only the main thread may set;
off the main thread those bounds are off and an answer is parsed without a time limit.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

TIMEOUT_S = 5  # per parse and per comparison, where math-verify can enforce it
_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_BARE_ROOT = re.compile(r"\\sqrt\s*(\d+)")
_REPEATING = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}")


def equivalent(got: str, want: str) -> bool:
    """`got` and `want` (LaTeX, without dollar signs or a box) denote the same answer."""
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold, answer = (_parse(text, timeout) for text in (want, got))
    if not gold or not answer:
        return _spelling(got) == _spelling(want)
    return bool(verify(gold, answer, timeout_seconds=timeout))


def _parse(text: str, timeout: int | None) -> list[object]:
    return list(parse(f"${rewrite(text)}$", extraction_config=list(_CONFIG), parsing_timeout=timeout))


def rewrite(text: str) -> str:
    """`\\sqrt 13` as `\\sqrt{13}`, `4.\\overline{6}` as `\\frac{14}{3}`, a closing full stop dropped."""
    return _REPEATING.sub(_fraction, _BARE_ROOT.sub(r"\\sqrt{\1}", text.strip().rstrip(".")))


def _fraction(match: re.Match[str]) -> str:
    sign, whole, fixed, repeat = match.groups()
    value = Fraction(int(whole or "0")) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(fixed))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _spelling(text: str) -> str:
    return re.sub(r"\s+", "", text).strip("$").rstrip(".")
