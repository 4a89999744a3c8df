"""Answer checkers: numbers for GSM8K, equivalent answers for MATH-500, programs run against tests for
HumanEval and MBPP. MT-Bench has no checker (it is run for acceptance and throughput only).

Seed 000: "GSM8K answers were checked numerically. HumanEval solutions were run against their unit
tests." Every checker returns a `Verdict` so the report counts pass rates the same way.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from fractions import Fraction

from ornith_stack.bench.datasets import Problem
from ornith_stack.bench.sandbox import CodeJob, Limits, run_tests

# A number: a minus sign only when it touches the digits and follows no word character, digit groups
# with commas, decimals, and a fraction written n/m.
_NUMBER = re.compile(r"(?<![\w.])-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|(?<![\w.])-?\.\d+")
_ANSWER_LINE = re.compile(r"(?im)(?:####|final answer|the answer is|answer\s*[:=]).*$")
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    extracted: str | None
    detail: str = ""


# -- numbers (GSM8K) --------------------------------------------------------------------------------
def parse_number(text: str) -> Fraction | None:
    """'$1,234.50' -> 1234.5, '3/4' -> 3/4, '\\frac{3}{4}' -> 3/4; None when the text is not a number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    frac = re.fullmatch(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", cleaned)
    if frac:
        cleaned = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}"
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_gsm8k_answer(response: str) -> str | None:
    """The final answer: the last number inside the last \\boxed{}, else the last number on the last
    answer line ('#### N', 'The answer is N', 'Final answer: N'), else the last number in the text."""
    boxed = boxed_answers(response)
    for text in (boxed[-1] if boxed else None, _last_answer_line(response), response):
        numbers = _numbers(text) if text else []
        if numbers:
            return numbers[-1]
    return None


def _last_answer_line(response: str) -> str | None:
    lines = _ANSWER_LINE.findall(response)
    return lines[-1] if lines else None


def _numbers(text: str) -> list[str]:
    text = re.sub(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", text)
    return [_clean(n) for n in _NUMBER.findall(text)]


def reference_answer(answer: str) -> str:
    """N of a GSM8K reference solution, which ends with '#### N' (a bare N is taken as it is)."""
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


def _clean(number: str) -> str:
    """'$1,234.50' -> '1234.50': currency and thousands separators go."""
    return number.replace(" ", "").replace("$", "").replace(",", "")


# -- MATH-500 -------------------------------------------------------------------------------------------
def boxed_answers(text: str) -> list[str]:
    """The contents of every \\boxed{...} (or \\fbox{...}), braces balanced."""
    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start:i])
                break
    return found


def normalize_math(answer: str) -> str:
    """A LaTeX answer in one canonical spelling: no spaces, sizing commands, text wrappers, degree signs
    dollar signs or trailing units; \\dfrac and \\tfrac as \\frac; \\frac12 as \\frac{1}{2}; a lone 'x =' dropped."""
    s = answer.strip().strip("$").strip()
    s = re.sub(r"\\(?:text|mbox)\{\s[^{}]*\}\s*$", "", s)  # a unit after the value: '\text{ degrees}'
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""),
                     ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", ""), ("%", ""), ("\\dfrac", "\\frac"),
                     ("\\tfrac", "\\frac"), ("\\$", ""), ("dfrac", "frac")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"^[a-zA-Z]=", "", s)
    s = re.sub(r"(\d),(\d\d\d)(?!\d)", r"\1\2", s)
    return s.rstrip(".")


def math_equivalent(got: str, want: str) -> bool:
    a, b = normalize_math(got), normalize_math(want)
    if a == b:
        return True
    x, y = parse_number(a), parse_number(b)
    return x is not None and x == y


def check_math(response: str, answer: str) -> Verdict:
    boxed = boxed_answers(response)
    if not boxed:
        return Verdict(False, None, "no \\boxed{} answer")
    got = boxed[-1]
    ok = math_equivalent(got, answer)
    return Verdict(ok, got, "" if ok else f"expected {answer}, got {got}")


# -- code (HumanEval, MBPP) ---------------------------------------------------------------------------
def extract_code(response: str, entry_point: str | None = None) -> str:
    """The code of a chat answer: among Python fences (```python, ```python3, ```py or bare), the last one
    that defines `entry_point`, else the longest; the whole answer when it has no fence."""
    blocks = [code for tag, code in _FENCE.findall(response) if tag.lower() in _PYTHON_TAGS and code.strip()]
    if not blocks:
        return response
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return defining[-1]
    return max(blocks, key=len)


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def humaneval_solution(prompt: str, response: str, entry_point: str) -> str:
    """Prompt (imports, helpers and the stub) then the model's code. Chat models usually answer with the
    whole function, whose definition replaces the stub; an answer with only the body is appended to the
    prompt, as HumanEval completions are."""
    code = extract_code(response, entry_point)
    if _defines(code, entry_point):
        return prompt + "    pass\n\n" + textwrap.dedent(code)
    return prompt + textwrap.indent(textwrap.dedent(code), "    ")


def check_humaneval(
    prompt: str, response: str, test: str, entry_point: str, limits: Limits | None = None
) -> Verdict:
    """The prompt also runs in the judge, since some HumanEval tests call the prompt's helper functions."""
    job = CodeJob(humaneval_solution(prompt, response, entry_point), setup=prompt,
                  tests=f"{test}\n\ncheck({entry_point})\n", functions=(entry_point,))
    result = run_tests(job, limits)
    return Verdict(result.passed, extract_code(response, entry_point), result.detail or result.status)


def check_mbpp(
    response: str, tests: list[str], entry_points: tuple[str, ...], setup: str = "",
    limits: Limits | None = None,
) -> Verdict:
    code = extract_code(response, entry_points[0] if entry_points else None)
    job = CodeJob(textwrap.dedent(code), setup=setup, tests="\n".join(tests) + "\n", functions=entry_points)
    result = run_tests(job, limits)
    return Verdict(result.passed, code, result.detail or result.status)


def check(problem: Problem, response: str, limits: Limits | None = None) -> Verdict | None:
    """The verdict on one answer by its task's checker; None for a task without one (MT-Bench)."""
    if problem.task == "gsm8k":
        return check_gsm8k(response, problem.answer)
    if problem.task == "math500":
        return check_math(response, problem.answer)
    if problem.task == "humaneval":
        return check_humaneval(problem.prompt, response, problem.test, problem.entry_point, limits)
    if problem.task == "mbpp":
        return check_mbpp(response, problem.test.splitlines(), problem.entry_points, problem.setup, limits)
    return None
