"""What the user asks of `tune`: the latency target (SLO), the workload, the time budget and the rates."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ornith_stack.errors import UserError, shown

# The SLO keys `tune` accepts, and the bench's percentile field each is read from.
SLO_KEYS = {"ttft_p99": "ttft_ms", "tpot_p99": "tpot_ms"}
MAX_BUDGET_MIN = 7 * 24 * 60  # a week: anything longer is a typo, not a plan


@dataclass(frozen=True)
class Slo:
    """p99 latency bounds in milliseconds; a request level meets the SLO when both p99s are within them."""

    ttft_p99_ms: float
    tpot_p99_ms: float

    def misses(self, ttft_p99_ms: float | None, tpot_p99_ms: float | None) -> float:
        """How far a level is from the SLO: the larger relative excess (0 when it meets it; inf unmeasured)."""
        if ttft_p99_ms is None or tpot_p99_ms is None:
            return math.inf
        return max(0.0, ttft_p99_ms / self.ttft_p99_ms - 1, tpot_p99_ms / self.tpot_p99_ms - 1)

    def text(self) -> str:
        return f"ttft_p99:{self.ttft_p99_ms:g} tpot_p99:{self.tpot_p99_ms:g}"


def parse_slo(text: str) -> Slo:
    """`ttft_p99:MS tpot_p99:MS` (space- or comma-separated, both required)."""
    values: dict[str, float] = {}
    for word in text.replace(",", " ").split():
        key, _, value = word.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if key not in SLO_KEYS or not math.isfinite(number) or number <= 0 or key in values:
            raise UserError(f"--slo {shown(text)}: expected 'ttft_p99:MS tpot_p99:MS' with positive milliseconds, "
                            f"each key once (got {shown(word)})")
        values[key] = number
    missing = [k for k in SLO_KEYS if k not in values]
    if missing:
        raise UserError(f"--slo {shown(text)}: missing {', '.join(missing)}; e.g. --slo 'ttft_p99:500 tpot_p99:50'")
    return Slo(values["ttft_p99"], values["tpot_p99"])


@dataclass(frozen=True)
class Workload:
    """The requests each level sends: random prompts of a length, or a JSONL file of prompts."""

    input_len: int | None = None
    output_len: int = 128
    dataset_path: Path | None = None

    def bench_args(self) -> list[str]:
        """The bench CLI's options for this workload."""
        if self.dataset_path is not None:
            return ["--dataset-path", str(self.dataset_path), "--random-output-len", str(self.output_len)]
        return ["--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len)]

    def text(self) -> str:
        return f"dataset:{self.dataset_path}" if self.dataset_path else f"random:{self.input_len}:{self.output_len}"


def parse_workload(workload: str | None, dataset_path: Path | None) -> Workload:
    """`random:IN:OUT` or --dataset-path FILE (not both); the default is random:256:128."""
    if workload is not None and dataset_path is not None:
        raise UserError("give --workload or --dataset-path, not both")
    if dataset_path is not None:
        if not dataset_path.is_file():
            raise UserError(f"--dataset-path {dataset_path}: no such file")
        return Workload(dataset_path=dataset_path)
    parts = (workload or "random:256:128").split(":")
    try:
        input_len, output_len = (int(p) for p in parts[1:]) if parts[0] == "random" and len(parts) == 3 else (0, 0)
    except ValueError:
        input_len = output_len = 0
    if input_len < 1 or output_len < 2:
        raise UserError(f"--workload {shown(workload)}: expected random:IN:OUT with IN >= 1 and OUT >= 2 tokens, "
                        "e.g. random:256:128")
    return Workload(input_len=input_len, output_len=output_len)


def parse_budget(minutes: float) -> float:
    """The budget in seconds."""
    if not math.isfinite(minutes) or not 0 < minutes <= MAX_BUDGET_MIN:
        raise UserError(f"--budget {minutes:g}: expected minutes, more than 0 and at most {MAX_BUDGET_MIN}")
    return minutes * 60.0


def parse_rates(text: str) -> tuple[float, ...]:
    """The request rates each candidate climbs, per second, rising; inf (no pacing) may come last."""
    try:
        rates = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        rates = ()
    if not rates or min(rates) <= 0 or any(math.isnan(r) for r in rates) or list(rates) != sorted(set(rates)):
        raise UserError(f"--rates {shown(text)}: expected rising requests per second, comma-separated, e.g. 1,2,4,8,inf")
    return rates
