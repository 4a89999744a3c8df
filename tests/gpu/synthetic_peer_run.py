"""Issue 32: `ornith-stack bench` and SGLang's `bench_serving` held to the truth of an engine with known timing.

On the H200 the two tools' TTFT differed at 32 streams (ours 14% lower in most pairs), and the GPU engine cannot say
which is right. tests/synthetic_engine.py can: it records when it read each request's body and wrote each token. Both
tools run here, on the CPU machine, against it, alternated, at each level; beside each tool's own figures the
engine's truth for that run (`synthetic_engine.truth`) and the client's dispatch latency: from a slot freeing (a
request's last token written) to the engine reading the next request's body, which in a closed loop at a fixed
concurrency is the client's own delay.

bench_serving comes from the GPU payload (tests/gpu/make_sglang_payload.sh's `.gpu/sglang/site`, cp312 wheels), run
by a Python 3.12 that has the few modules the device's image adds (numpy, torch, ...: the command below); ours from
this checkout's environment. The tokenizer is the tiny model's (`ornith-stack tiny-model DIR`).

    python3 tests/gpu/synthetic_peer_run.py OUT --python312 /tmp/v312/bin/python --tokenizer /tmp/tiny-model

Writes OUT/table.md, OUT/summary.json and each run's own output (ours-C-N/, theirs-C-N.jsonl and logs).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from synthetic_engine import MODEL, truth  # noqa: E402

REPO = Path(__file__).parents[2]
PROMPT_WORDS, OUTPUT_TOKENS, ROUNDS_OF_C = 60, 64, 8
ORDER = ("theirs", "ours", "ours", "theirs")


def write_prompts(out: Path, count: int) -> tuple[Path, Path]:
    """The same texts for both tools: ours as `vllm bench serve`'s custom rows, theirs as ShareGPT conversations."""
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    texts = [" ".join(rng.choice(words) for _ in range(PROMPT_WORDS)) for _ in range(count)]
    ours, theirs = out / "ours-prompts.jsonl", out / "theirs-prompts.json"
    ours.write_text("".join(json.dumps({"prompt": t, "output_tokens": OUTPUT_TOKENS}) + "\n" for t in texts))
    theirs.write_text(
        json.dumps(
            [
                {"id": str(i), "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]}
                for i, t in enumerate(texts)
            ]
        )
    )
    return ours, theirs


def trace(base: str) -> dict:
    with urllib.request.urlopen(base + "/trace", timeout=30) as answer:
        return json.loads(answer.read())


def dispatch_ms(run: list, concurrency: int) -> list[float]:
    """Per request after the first `concurrency`: the engine reading its body minus the latest earlier request end."""
    ends = sorted(sent[-1] for _, sent in run)
    gaps = []
    for start in sorted(s for s, _ in run)[concurrency:]:
        i = bisect.bisect_right(ends, start) - 1
        if i >= 0:
            gaps.append(1000 * (start - ends[i]))
    return gaps


def run_theirs(args: argparse.Namespace, base: str, prompts: Path, level: int, n: int, out: Path) -> dict:
    result = out / f"theirs-{level}-{n}.jsonl"
    env = {**os.environ, "PYTHONPATH": str(args.sglang_site), "HF_HUB_OFFLINE": "1"}
    argv = [args.python312, "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat", "--base-url", base,
            "--model", MODEL, "--tokenizer", args.tokenizer, "--dataset-name", "sharegpt", "--dataset-path",
            str(prompts), "--num-prompts", str(ROUNDS_OF_C * level), "--sharegpt-output-len", str(OUTPUT_TOKENS),
            "--max-concurrency", str(level), "--request-rate", "inf", "--warmup-requests", str(level),
            "--disable-tqdm", "--output-file", str(result)]  # fmt: skip
    with open(out / f"theirs-{level}-{n}.log", "wb") as log:
        subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=600)
    row = json.loads(result.read_text().strip().splitlines()[-1])
    return {"output tok/s": row["output_throughput"], "median TTFT ms": row["median_ttft_ms"],
            "median TPOT ms": row["median_tpot_ms"]}  # fmt: skip


def run_ours(base: str, prompts: Path, level: int, n: int, out: Path, tokenizer: str) -> dict:
    folder = out / f"ours-{level}-{n}"
    argv = [sys.executable, "-m", "ornith_stack", "bench", "--url", base, "--suite", "serving", "--out", str(folder),
            "--dataset-path", str(prompts), "--num-prompts", str(ROUNDS_OF_C * level), "--max-concurrency",
            str(level), "--random-output-len", str(OUTPUT_TOKENS), "--warmup", "1", "--repeats", "1", "--seed", "0",
            "--tokenizer", tokenizer]  # fmt: skip
    with open(out / f"ours-{level}-{n}.log", "wb") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=600)
    metrics = json.loads((folder / "bench.json").read_text())["suites"]["serving"]["levels"][0]["runs"][0]
    return {"output tok/s": metrics["output_tok_s"], "median TTFT ms": metrics["ttft_ms"]["median"],
            "median TPOT ms": metrics["tpot_ms"]["median"]}  # fmt: skip


def measure(args: argparse.Namespace, base: str, out: Path) -> dict:
    ours_prompts, theirs_prompts = write_prompts(out, ROUNDS_OF_C * max(args.levels))
    runs: dict = {}
    for level in args.levels:
        for n, who in enumerate(ORDER * args.rounds):
            trace(base)  # forget what came before: the run's requests are the last ones of the next trace
            figures = (
                run_ours(base, ours_prompts, level, n, out, args.tokenizer)
                if who == "ours"
                else run_theirs(args, base, theirs_prompts, level, n, out)
            )
            requests = sorted(trace(base)["requests"], key=lambda r: r[0])[-ROUNDS_OF_C * level :]
            real = truth({"requests": requests}, len(requests))
            figures |= {"truth tok/s": real.output_tok_s, "truth TTFT ms": real.ttft_ms, "truth TPOT ms": real.tpot_ms,
                        "dispatch ms": statistics.median(dispatch_ms(requests, level) or [0.0])}  # fmt: skip
            runs.setdefault(str(level), {"ours": [], "theirs": []})[who].append(figures)
            print(f"concurrency {level} {who}: " + json.dumps({k: round(v, 2) for k, v in figures.items()}), flush=True)
    return runs


def table(runs: dict) -> str:
    """Per level and tool, medians over its runs: what it read against what the engine did in the same run (output
    tok/s, TTFT, TPOT), the engine's own output rate (how hard the client drove it) and the dispatch latency."""
    lines = ["| concurrency | tool | output tok/s read / truth | engine's output tok/s | median TTFT ms: read "
             "(truth, read - truth) | median TPOT ms: read (truth) | dispatch latency ms |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    med = statistics.median
    for level, sides in runs.items():
        for who, name in (("ours", "ornith-stack bench"), ("theirs", "bench_serving")):
            r = sides[who]
            ttft, real = med(x["median TTFT ms"] for x in r), med(x["truth TTFT ms"] for x in r)
            lines.append(
                f"| {level} | {name} | {med(x['output tok/s'] / x['truth tok/s'] for x in r):.3f} | "
                f"{med(x['truth tok/s'] for x in r):,.0f} | {ttft:.1f} ({real:.1f}, +{ttft - real:.1f}) | "
                f"{med(x['median TPOT ms'] for x in r):.2f} ({med(x['truth TPOT ms'] for x in r):.2f}) | "
                f"{med(x['dispatch ms'] for x in r):.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--python312", default="python3.12", help="a Python 3.12 for the payload's bench_serving")
    parser.add_argument("--sglang-site", type=Path, default=REPO / ".gpu/sglang/site")
    parser.add_argument("--tokenizer", help="the tiny model's folder (needed to measure)")
    parser.add_argument("--levels", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=1, help="times the B A A B order runs per level")
    parser.add_argument("--table-only", action="store_true", help="only rewrite table.md from OUT/summary.json")
    args = parser.parse_args()
    if args.table_only:
        text = table(json.loads((args.out / "summary.json").read_text()))
        (args.out / "table.md").write_text(text)
        print(text)
        return
    if not args.tokenizer:
        parser.error("--tokenizer is needed to measure")
    args.out.mkdir(parents=True, exist_ok=True)
    engine = subprocess.Popen(
        [sys.executable, str(REPO / "tests/synthetic_engine.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert engine.stdout is not None
        base = f"http://127.0.0.1:{int(engine.stdout.readline().split()[1])}"
        runs = measure(args, base, args.out)
    finally:
        engine.kill()
    text = table(runs)
    (args.out / "table.md").write_text(text)
    (args.out / "summary.json").write_text(json.dumps(runs, indent=1))
    print(text)


if __name__ == "__main__":
    main()
