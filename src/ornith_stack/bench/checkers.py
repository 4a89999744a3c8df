"""Answer checkers: GSM8K answers compared as numbers, HumanEval completions run against their tests.

Seed 000: "GSM8K answers were checked numerically. HumanEval solutions were run against their unit
tests." Both checkers return a `Verdict` so the report counts pass rates the same way.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from ornith_stack.bench.sandbox import Limits, TestJob, run_tests

_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\.\d+"
_MARKED = [
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"(?i)(?:final answer|the answer is|answer)\s*(?:is)?\s*[:=]?\s*\**\s*(" + _NUMBER + ")"),
]
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    extracted: str | None
    detail: str = ""


def parse_number(text: str) -> Decimal | None:
    """'$1,234.50' -> Decimal('1234.50'); None when the text holds no number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def extract_gsm8k_answer(response: str) -> str | None:
    """The final numeric answer of a solution: an explicit marker (#### N, \\boxed{N}, 'the answer is N')
    wins, the last such marker if several; otherwise the last number in the text."""
    for pattern in _MARKED:
        found = pattern.findall(response)
        if found:
            return _clean(found[-1])
    numbers = re.findall(_NUMBER, response)
    return _clean(numbers[-1]) if numbers else None


def reference_answer(answer: str) -> str:
    """GSM8K's reference solutions end with '#### N'; the project's sample stores N alone."""
    return answer.rsplit("####", 1)[-1].strip()


def check_gsm8k(response: str, answer: str) -> Verdict:
    extracted = extract_gsm8k_answer(response)
    got = parse_number(extracted) if extracted else None
    want = parse_number(reference_answer(answer))
    if want is None:
        raise ValueError(f"reference answer {answer!r} is not a number")
    if got is None:
        return Verdict(False, extracted, "no number in the answer")
    return Verdict(got == want, extracted, "" if got == want else f"expected {want}, got {got}")


def extract_code(response: str) -> str:
    """The code of a chat answer: the longest fenced block, or the whole answer when unfenced."""
    blocks = [b for b in _CODE_BLOCK.findall(response) if b.strip()]
    return max(blocks, key=len) if blocks else response


def build_program(prompt: str, response: str, test: str, entry_point: str) -> str:
    """Prompt (imports and the stub), the model's code, the tests, then check(entry_point).

    Chat models usually answer with the whole function; defining it after the prompt's stub replaces
    the stub. An answer with only the body is appended to the prompt, as HumanEval completions are."""
    code = extract_code(response)
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        solution = prompt + "\n    pass\n\n" + textwrap.dedent(code)
    else:
        body = textwrap.indent(textwrap.dedent(code), "    ")
        solution = prompt + body
    return f"{solution}\n\n{test}\n\ncheck({entry_point})\n"


def check_humaneval(
    prompt: str, response: str, test: str, entry_point: str, limits: Limits | None = None
) -> Verdict:
    program = build_program(prompt, response, test, entry_point)
    result = run_program(program, limits or Limits())
    return Verdict(result.passed, extract_code(response), result.detail or result.status)


def _clean(number: str) -> str:
    """'$1,234.50.' -> '1234.50': currency, thousands separators and a sentence's full stop go."""
    return number.replace(" ", "").replace("$", "").replace(",", "").rstrip(".")
