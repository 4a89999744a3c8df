"""Prompts for the speed suites: distinct per request (no prefix-cache hits) and sized in tokens.

The client has no tokenizer, so a long prompt is sized by calibration: two short requests tell how
many tokens the server counts for N filler words (usage.prompt_tokens), and the filler is scaled
linearly. The filler is seeded pseudo-random words, not a repeated paragraph, so n-gram drafting does
not find the prompt's own text and flatter the decode figures.
"""

from __future__ import annotations

import random
import uuid

from ornith_stack.errors import UserError

_WORDS = (
    "river", "mountain", "signal", "harbor", "lantern", "orbit", "meadow", "copper", "winter", "engine",
    "garden", "thunder", "silver", "canyon", "market", "violet", "planet", "summer", "anchor", "bridge",
    "cedar", "desert", "ember", "falcon", "glacier", "hollow", "island", "jasmine", "kettle", "ladder",
    "marble", "nectar", "oyster", "pepper", "quartz", "raven", "saddle", "timber", "umber", "velvet",
    "willow", "yarrow", "zephyr", "amber", "basket", "candle", "dragon", "echo", "feather", "granite",
    "harvest", "ivory", "juniper", "kernel", "lemon", "mirror", "needle", "ocean", "pillar", "quiver",
    "ribbon", "spindle", "tunnel", "valley", "wander", "wrench", "atlas", "beacon", "cobalt", "dune",
    "fable", "grove", "horizon", "inlet", "jungle", "knot", "lagoon", "mosaic", "nimbus", "onyx",
    "prism", "ridge", "sparrow", "tide", "utopia",
)

DECODE_TOPICS = (
    "the history of lighthouses and how their lamps changed over three centuries",
    "how a city water system works, from reservoir to tap",
    "the life cycle of a star, from nebula to remnant",
    "how to plan a vegetable garden for a cold climate",
    "the design trade-offs of suspension bridges",
    "why honeybees dance and what the dance encodes",
    "the invention of the printing press and its consequences",
    "how glaciers shape valleys",
)


def nonce(seed: int | None = None) -> str:
    """A tag that makes a prompt distinct: random, or the same for the same seed (`--seed` repeats a run's
    prompts exactly)."""
    return uuid.uuid4().hex[:8] if seed is None else f"{random.Random(seed).getrandbits(32):08x}"


def decode_prompt(index: int) -> str:
    topic = DECODE_TOPICS[index % len(DECODE_TOPICS)]
    return f"[{nonce()}] Write a long, detailed essay about {topic}."


def filler(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(max(words, 0)))


def sized_prompt(words: int, seed: int = 0, *, reproducible: bool = False) -> str:
    """A prompt of `words` filler words; `reproducible`: the same text for the same seed, tag included."""
    return f"[{nonce(seed if reproducible else None)}] Read the notes below, then write a long summary of them.\n\n{filler(words, seed)}"


class TokenScale:
    """prompt tokens ~= base + per_word x words, fitted from two measured prompts."""

    def __init__(self, points: list[tuple[int, int]]) -> None:
        (w1, t1), (w2, t2) = sorted(points)[:2]
        if w2 == w1 or t2 <= t1:
            # An engine (or a proxy) that reports a fixed or shrinking prompt_tokens cannot be calibrated.
            raise UserError(f"cannot size prompts: the engine reported usage.prompt_tokens {t1} for a prompt of "
                            f"{w1} words and {t2} for one of {w2}; its prompt token count does not grow with the "
                            "prompt. Send prompts from a file instead (--dataset-path, the serving suite), or drop "
                            "the suites that size prompts (ttft-sweep, serving)")
        self.per_word = (t2 - t1) / (w2 - w1)
        self.base = t1 - self.per_word * w1

    def words_for(self, tokens: int) -> int:
        return max(int((tokens - self.base) / self.per_word), 1)


def sweep_lengths(requested: list[int], max_model_len: int | None, max_tokens: int) -> tuple[list[int], list[int]]:
    """Prompt lengths to run and those dropped: each capped so prompt + generation fits the server's
    window (with 1% slack for the fit's error); lengths above the cap collapse onto it, as the seed's
    largest point is 'the largest prompt the window admits'."""
    if not max_model_len:
        return sorted(set(requested)), []
    cap = max_model_len - max_tokens - max(max_model_len // 100, 16)
    if cap <= 0:
        return [], sorted(requested)
    kept = sorted({min(length, cap) for length in requested})
    dropped = sorted(length for length in requested if length > cap)
    return kept, dropped
