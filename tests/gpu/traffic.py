"""Send chat traffic to a running OpenAI-compatible engine and record what it answered.

    python3 tests/gpu/traffic.py URL MODEL OUT_DIR [--requests 48] [--concurrency 8] [--max-tokens 256]

Stdlib only (it runs on the GPU machine next to the engine). Writes into OUT_DIR:
  models.json            GET /v1/models
  chat-completion.json   one chat completion (enable_thinking false, greedy), the full response body
  metrics.txt            GET /metrics after all traffic
  traffic.json           request counts, tokens, wall time, tok/s, and the speculative-decoding counters
The prompts repeat themselves so that greedy output loops and drafts (ngram or DFlash) get accepted.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPTS = [
    "Repeat exactly, forty times: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat.",
    "Count: one two three one two three one two three one two three one two three one two three",
    "abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc abc",
    "Write the word hello over and over: hello hello hello hello hello hello hello hello hello",
]


def _get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def chat_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
        "ignore_eos": ignore_eos,  # vLLM extension: fixed-length outputs make tok/s comparable
    }


def spec_counters(metrics: str) -> dict:
    """Sum the vllm:spec_decode_* counters over label sets; mean acceptance length = 1 + accepted / drafts."""
    out: dict[str, float] = {}
    per_pos: dict[str, float] = {}
    for line in metrics.splitlines():
        m = re.match(r"^(vllm:[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if not m or m.group(1).endswith("_created"):  # prometheus_client's creation timestamps
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = re.search(r'position="(\d+)"', labels)
            per_pos[pos.group(1) if pos else "?"] = per_pos.get(pos.group(1) if pos else "?", 0) + value
        elif name.startswith("vllm:spec_decode_") or name in (
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
        ):
            out[name] = out.get(name, 0) + value
    drafts = out.get("vllm:spec_decode_num_drafts_total", 0)
    accepted = out.get("vllm:spec_decode_num_accepted_tokens_total", 0)
    draft_tokens = out.get("vllm:spec_decode_num_draft_tokens_total", 0)
    out["mean_acceptance_length"] = 1 + accepted / drafts if drafts else None
    out["draft_acceptance_rate"] = accepted / draft_tokens if draft_tokens else None
    out["accepted_per_position"] = dict(
        sorted(per_pos.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1)
    )
    return out


def run_load(base: str, model: str, n: int, concurrency: int, max_tokens: int) -> dict:
    def one(i: int) -> int:
        body = chat_body(model, PROMPTS[i % len(PROMPTS)], max_tokens, ignore_eos=True)
        return _post(f"{base}/v1/chat/completions", body)["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    return {
        "requests": n,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "completion_tokens": sum(tokens),
        "wall_s": round(wall, 3),
        "output_tok_per_s": round(sum(tokens) / wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    base = args.url.rstrip("/")
    args.out.mkdir(parents=True, exist_ok=True)

    (args.out / "models.json").write_bytes(_get(f"{base}/v1/models"))
    chat = _post(f"{base}/v1/chat/completions", chat_body(args.model, PROMPTS[0], 64, ignore_eos=False))
    (args.out / "chat-completion.json").write_text(json.dumps(chat, indent=2) + "\n")

    single = run_load(base, args.model, 4, 1, args.max_tokens)
    batched = run_load(base, args.model, args.requests, args.concurrency, args.max_tokens)
    time.sleep(2)  # let the engine's stats logger publish the last interval
    metrics = _get(f"{base}/metrics").decode()
    (args.out / "metrics.txt").write_text(metrics)
    result = {
        "single_stream": single,
        "batched": batched,
        "spec_decode": spec_counters(metrics),
        "chat_usage": chat.get("usage"),
    }
    (args.out / "traffic.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
