"""Speculative acceptance per request and per task, in the two definitions the seeds' sources use.

Per request (seed 004): completion tokens / verification steps of one request run alone; the engine's
counters read around it give its steps and accepted draft tokens (SGLang counts every generated token as
a bonus or an accepted one, so 1 + accepted / steps is completion tokens / steps there). Per task:
- per-request mean: the mean of the per-request figures (seed 004's "acceptance length");
- token-weighted: 1 + all accepted / all steps, i.e. each step weighs the same (the engines' own gauge);
- draft-acceptance rate: accepted / drafted tokens, and acceptance per draft position: the share of
  steps whose k-th drafted token was accepted (vLLM counts both; SGLang exports neither).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ornith_stack.bench import stats
from ornith_stack.bench.result import Acceptance, Sample, SpecWindow
from ornith_stack.engines import SpecCounters


def per_request(before: SpecCounters | None, after: SpecCounters) -> SpecWindow | None:
    """The counters' movement over one request's window; None after a reset or when no step ran."""
    if before is None or after.steps < before.steps or after.accepted < before.accepted:
        return None
    steps = after.steps - before.steps
    if steps <= 0:
        return None
    drafted = after.drafted - before.drafted if after.drafted is not None and before.drafted is not None else None
    positions = {str(k): v - before.accepted_per_position.get(k, 0.0) for k, v in after.accepted_per_position.items()}
    return SpecWindow(steps=steps, accepted=after.accepted - before.accepted, drafted=drafted,
                      accepted_per_position=positions)


def from_sample(sample: Sample) -> SpecWindow | None:
    """One request's steps: SGLang's own count for the request (`spec_verify_ct`) when the stream
    carried it, else the counters' window around it."""
    steps, tokens = sample.extra.spec_verify_ct, sample.completion_tokens
    if steps is not None and steps > 0 and tokens is not None:
        return SpecWindow(steps=steps, accepted=max(tokens - steps, 0))
    return sample.extra.spec


def summarize_acceptance(samples: Sequence[Sample]) -> Acceptance | None:
    """The task's acceptance in both definitions, the draft-acceptance rate and per-position rates."""
    spec = [x for x in (from_sample(s) for s in samples if not s.error) if x and x.steps > 0]
    if not spec:
        return None
    steps = sum(x.steps for x in spec)
    accepted = sum(x.accepted for x in spec)
    drafted = [x.drafted for x in spec if x.drafted is not None]
    positions: dict[str, float] = {}
    for x in spec:
        for k, v in x.accepted_per_position.items():
            positions[k] = positions.get(k, 0.0) + v
    return Acceptance(
        requests=len(spec),
        per_request_mean=statistics.fmean(1.0 + x.accepted / x.steps for x in spec),
        token_weighted=1.0 + accepted / steps,
        draft_acceptance_rate=stats.ratio(accepted, sum(drafted)) if len(drafted) == len(spec) else None,
        per_position={k: v / steps for k, v in sorted(positions.items(), key=lambda kv: _position(kv[0]))},
    )


def _position(key: str) -> int:
    """Draft positions are counted from 0; a key that is not a number (a hostile saved result) sorts last."""
    return int(key) if key.isdigit() else 1 << 30
