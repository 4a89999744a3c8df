"""Answer checkers: numbers for GSM8K, equivalent answers for MATH-500, programs run against tests for
HumanEval and MBPP. MT-Bench has no checker (it is run for acceptance and throughput only).

Seed 000: "GSM8K answers were checked numerically. HumanEval solutions were run against their unit
tests." Every checker returns a `Verdict` so the report counts pass rates the same way.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from fractions import Fraction

from ornith_stack.bench import verify_math
from ornith_stack.bench.datasets import Problem
from ornith_stack.bench.sandbox import CodeJob, Limits, run_tests

_FENCE = re.compile(r"(`{3,}|~{3,})[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:\1|\Z)", re.DOTALL)
_CODE_START = re.compile(r"(?:async\s+def|def|class|import|from\s+\S+\s+import|@)\b")
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    extracted: str | None
    detail: str = ""


# -- numbers (GSM8K) --------------------------------------------------------------------------------
# lm-eval-harness's GSM8K filters: "strict-match" takes the first '#### N', "flexible-extract" the last
# number-like run. Here '#### $N' and 'N/M' count too, and a flexible match must hold a digit.
_STRICT = re.compile(r"#### \$?(-?[0-9.,]+(?:/[0-9]+)?)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,}(?:/[0-9]+)?)|(-?[0-9]+(?:/[0-9]+)?)")
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def parse_number(text: str) -> Fraction | None:
    """'$1,234.50' -> 1234.5, '3/4' -> 3/4, '\\frac{3}{4}' -> 3/4; None when the text is not a number."""
    cleaned = _LATEX_FRACTION.sub(r"\1/\2", _clean(text).replace(" ", ""))
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_gsm8k_answer(response: str) -> str | None:
    """The final answer, as lm-eval-harness reads GSM8K: the first '#### N' (strict), else the last
    \\boxed{} holding a number (what the dflash prompt asks for), else the last number in the text
    (flexible); currency signs, thousands separators and a trailing full stop go."""
    strict = _STRICT.search(response)
    if strict and _has_digit(strict.group(1)):
        return _clean(strict.group(1))
    boxed = [b for b in boxed_answers(response) if _flexible(b)]
    return _flexible(boxed[-1] if boxed else response)


def _flexible(text: str) -> str | None:
    matches = [a or b for a, b in _FLEXIBLE.findall(_LATEX_FRACTION.sub(r"\1/\2", text))]
    numbers = [_clean(m) for m in matches if _has_digit(m)]
    return numbers[-1] if numbers else None


def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)


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
    """'$1,234.50.' -> '1234.50': currency, thousands separators and a closing full stop go."""
    return number.replace("$", "").replace(",", "").rstrip(".")


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


def math_equivalent(got: str, want: str) -> bool:
    """Whether two LaTeX answers are the same mathematical object, by Hugging Face's math-verify (sympy):
    fractions, radicals, intervals, sets, choices, units and thousands separators compare by meaning."""
    return verify_math.equivalent(got, want)


def check_math(response: str, answer: str) -> Verdict:
    boxed = boxed_answers(response)
    if not boxed:
        return Verdict(False, None, "no \\boxed{} answer")
    got = boxed[-1]
    ok = math_equivalent(got, answer)
    return Verdict(ok, got, "" if ok else f"expected {answer}, got {got}")


# -- code (HumanEval, MBPP) ---------------------------------------------------------------------------
def extract_code(response: str, entry_point: str | None = None) -> str:
    """The code of a chat answer. Among Python fences (``` or ~~~, tagged python, python3, py or bare):
    the last one that defines `entry_point`, after the other blocks that define names it uses (a helper
    in a second fence), else the longest block. Without a fence: from the first line that starts code
    (def, class, import, a decorator) to the last line that keeps it valid Python, else the whole answer."""
    blocks = [code for _, tag, code in _FENCE.findall(response) if tag.lower() in _PYTHON_TAGS and code.strip()]
    if not blocks:
        return _unfenced(response)
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return _with_helpers(defining[-1], [b for b in blocks if b is not defining[-1]])
    return max(blocks, key=len)


def _unfenced(response: str) -> str:
    lines = response.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return response
    for end in range(len(lines), start, -1):
        code = "".join(lines[start:end])
        if _parses(code):
            return code
    return "".join(lines[start:])


def _with_helpers(main: str, others: list[str]) -> str:
    """`main` after each other block that defines a name `main` (or a block already taken) uses."""
    taken: list[str] = []
    wanted = _names_used(main) - _names_defined(main)
    for block in others:
        if _parses(block) and _names_defined(block) & wanted:
            taken.append(block)
            wanted |= _names_used(block)
    return "\n".join([*taken, main])


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def _names_used(code: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    except SyntaxError:
        return set()


def _names_defined(code: str) -> set[str]:
    """Top-level functions, classes, assigned names and imports."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


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
