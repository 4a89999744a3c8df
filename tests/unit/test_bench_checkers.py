"""Answer checkers: GSM8K numbers and HumanEval programs, and the offline task sample they grade."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_datasets import sandboxed_rows

from ornith_stack.bench.checkers import (
    check_gsm8k,
    check_humaneval,
    extract_code,
    extract_gsm8k_answer,
    humaneval_solution,
)
from ornith_stack.bench.datasets import load_tasks
from ornith_stack.bench.sandbox import Limits
from ornith_stack.errors import UserError

DATA = Path(__file__).parents[2] / "src/ornith_stack/bench/data"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("Total is $1,234.50.\n#### $1,234.50", "1234.50"),
        ("First 12, then 30.\nThe answer is 42.", "42"),
        ("**Final answer:** 18", "18"),
        ("So the result is \\boxed{256}.", "256"),
        ("We get -5 degrees", "-5"),
        # A marker wins over numbers written after it (units, checks).
        ("#### 26\n(26 muffins; check: 96 - 70)", "26"),
        ("no digits at all", None),
        # The last number on the answer line, not the first.
        ("The answer is 12 - 4 = 8", "8"),
        ("Final answer: 3 boxes of 4, so 12", "12"),
        # A minus sign counts only when it touches the digits; '#### N' reads the number right after it.
        ("#### - 5", "5"),
        ("#### 10-3", "10"),
        # lm-eval-harness: the first '#### N' (strict), else the last number (flexible).
        ("#### 18 (which is 3 x 6)", "18"),
        ("It costs $1,234 in total.", "1234"),
        ("#### 7\nLater: #### 9", "7"),
        ("She pays 12 dollars a week for 52 weeks: 624 dollars.", "624"),
        ("That is 1,000,000.5 grams.", "1000000.5"),
        ("The dflash prompt asks for a box: \\boxed{\\$1,500} and 3 more words", "1500"),
        ("x = -7\n#### -7", "-7"),
        # Fractions.
        ("#### 3/4", "3/4"),
        ("So \\boxed{\\frac{3}{4}}", "3/4"),
    ],
)
def test_gsm8k_extracts_the_final_number(response: str, expected: str | None) -> None:
    assert extract_gsm8k_answer(response) == expected


def test_gsm8k_compares_fractions_by_value() -> None:
    assert check_gsm8k("#### 6/8", "0.75").passed
    assert check_gsm8k("The answer is \\frac{1}{2}", "0.5").passed
    assert not check_gsm8k("#### 1/3", "0.33").passed
    # '- 5' is five, not minus five.
    assert not check_gsm8k("#### - 5", "-5").passed


def test_gsm8k_compares_numerically_not_textually() -> None:
    assert check_gsm8k("#### 2,520", "2520").passed
    assert check_gsm8k("#### 33.00", "33").passed
    # GSM8K's own reference format ends with '#### N'.
    assert check_gsm8k("the answer is 72", "48 + 24 = 72\n#### 72").passed
    wrong = check_gsm8k("#### 71", "72")
    assert not wrong.passed and wrong.extracted == "71"
    assert not check_gsm8k("I cannot tell", "72").passed


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # Prose, then an unfenced definition, then prose again.
        ("Sure! Here is the function:\ndef f(x):\n    return x + 1\nThis adds one.", "def f(x):\n    return x + 1\n"),
        ("We need math.\nimport math\n\ndef f(x):\n    return math.floor(x)\n",
         "import math\n\ndef f(x):\n    return math.floor(x)\n"),
        # Tilde fences.
        ("~~~python\ndef f(x):\n    return 2\n~~~\nDone.", "def f(x):\n    return 2\n"),
        # A helper in a second fence is joined in front of the block that defines the entry point.
        ("First a helper:\n```python\ndef helper(x):\n    return x * 2\n```\nThen:\n```python\n"
         "def f(x):\n    return helper(x) + 1\n```\nAnd a demo:\n```python\nprint(f(3))\n```",
         "def helper(x):\n    return x * 2\n\ndef f(x):\n    return helper(x) + 1\n"),
    ],
)
def test_code_is_found_in_the_shapes_chat_models_answer_in(answer: str, expected: str) -> None:
    assert extract_code(answer, "f") == expected


def test_a_helper_in_a_second_fence_passes_humaneval() -> None:
    answer = ("```python\ndef plus(a, b):\n    return a + b\n```\n\n```python\n"
              "def add(a, b):\n    return plus(a, b)\n```")
    assert check_humaneval(PROMPT, answer, TEST, "add").passed
    # An unfenced answer after prose passes too.
    assert check_humaneval(PROMPT, "Here it is.\ndef add(a, b):\n    return a + b\n\nHope it helps!", TEST, "add").passed


def test_code_is_taken_from_the_fenced_block() -> None:
    answer = "Here you go:\n```python\ndef f(x):\n    return x + 1\n```\nIt adds one."
    assert extract_code(answer) == "def f(x):\n    return x + 1\n"
    assert extract_code("def f(x):\n    return x") == "def f(x):\n    return x"
    assert extract_code("```python3\ndef f(x):\n    return 2\n```") == "def f(x):\n    return 2\n"
    # A shell block is not Python.
    assert extract_code("```bash\npip install thing && run a long command here\n```\n```py\nx = 1\n```") == "x = 1\n"


def test_the_block_that_defines_the_entry_point_is_chosen() -> None:
    answer = ("```python\ndef add(a, b):\n    return a + b\n```\nUsage, in a longer block:\n"
              "```python\nprint(add(1, 2))\nprint(add(3, 4))\nprint(add(5, 6))\nprint(add(7, 8))\n```")
    assert extract_code(answer, "add") == "def add(a, b):\n    return a + b\n"
    assert check_humaneval(PROMPT, answer, TEST, "add").passed


def test_a_python3_fence_is_graded() -> None:
    assert check_humaneval(PROMPT, "```python3\ndef add(a, b):\n    return a + b\n```", TEST, "add").passed


def test_demo_code_under_a_main_guard_does_not_fail_a_correct_solution() -> None:
    answer = ("```python\ndef add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n"
              "    assert add(1, 1) == 3, 'a demo that would fail'\n    input()\n```")
    assert check_humaneval(PROMPT, answer, TEST, "add").passed


PROMPT = 'def add(a: int, b: int) -> int:\n    """Add two numbers."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"


def test_a_whole_function_answer_passes_and_a_wrong_one_fails() -> None:
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert check_humaneval(PROMPT, good, TEST, "add").passed
    verdict = check_humaneval(PROMPT, bad, TEST, "add")
    assert not verdict.passed and "AssertionError" in verdict.detail


def test_a_body_only_answer_is_appended_to_the_prompt() -> None:
    program = humaneval_solution(PROMPT, "return a + b", "add")
    assert program == PROMPT + "    return a + b"
    assert check_humaneval(PROMPT, "    return a + b\n", TEST, "add").passed


def test_an_answer_that_exits_early_does_not_pass() -> None:
    # sys.exit(0) before the tests run must not count as success.
    answer = "```python\nimport sys\nsys.exit(0)\ndef add(a, b):\n    return a - b\n```"
    assert not check_humaneval(PROMPT, answer, TEST, "add").passed


@pytest.mark.parametrize("index", sandboxed_rows("humaneval.jsonl"))
def test_every_bundled_humaneval_solution_passes_its_tests(index: int) -> None:
    row = json.loads((DATA / "humaneval.jsonl").read_text().splitlines()[index])
    verdict = check_humaneval(row["prompt"], row["canonical_solution"], row["test"], row["entry_point"],
                              Limits(wall_s=10))
    assert verdict.passed, (row["task_id"], verdict.detail)
    # ... and the tests are not vacuous: an answer returning None fails them.
    assert not check_humaneval(row["prompt"], "    return None\n", row["test"], row["entry_point"]).passed


def test_bundled_gsm8k_answers_check_against_themselves() -> None:
    rows = [json.loads(line) for line in (DATA / "gsm8k.jsonl").read_text().splitlines()]
    assert len(rows) == 128
    for row in rows:  # the worked solution, ending '#### N'
        assert check_gsm8k(row["answer"], row["answer"]).passed


def test_tasks_dir_overrides_the_bundled_sample(tmp_path: Path) -> None:
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    sets = {s.task: s for s in load_tasks(tmp_path)}
    assert sets["gsm8k"].source == str(tmp_path / "gsm8k.jsonl")
    assert sets["gsm8k"].problems[0].answer.endswith("#### 2")
    # humaneval.jsonl is absent there: it falls through to the package or the bundled sample.
    assert sets["humaneval"].problems


def test_a_malformed_tasks_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "gsm8k.jsonl").write_text('{"question": "x"}\n')
    with pytest.raises(UserError, match="lacks answer"):
        load_tasks(tmp_path)
    (tmp_path / "gsm8k.jsonl").write_text("not json\n")
    with pytest.raises(UserError, match="not JSON"):
        load_tasks(tmp_path)
    with pytest.raises(UserError, match="not a directory"):
        load_tasks(tmp_path / "missing")
