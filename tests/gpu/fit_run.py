"""A computed profile on the card it was computed for: does it serve like the uncapped engine, does the
planner predict the engine's own sizing, and does a restart with the compile caches kept skip the compile?

    python3 tests/gpu/fit_run.py OUT_DIR --target T --draft D [--gpu h200] [--levels 1,8,32]

Issue 30's GPU proof, on the one H200 a session is lent (run_sglang_h200.sh `fit`):
1. `ornith-stack profiles new fit-h200 --gpu GPU --count 1` into a profile folder of this run (the profile
   exactly as a user gets it), `plan fit-h200 --json` with the tiny checkpoints' configs (what the
   planner predicts for the KV pool and the running requests on this card);
2. the engine from `launch-args fit-h200` (sglang_run.engine_command: the tiny checkpoints and the overrides
   that file names, nothing else) with EMPTY compile-cache folders: seconds to healthy (cold);
3. the same command again with the cache folders kept: seconds to healthy (warm), then `ornith-stack bench
   --suite serving` at each level;
4. the same engine without --max-total-tokens / --max-running-requests (SGLang sizes both itself), the cache
   kept, the same bench: the uncapped reference.
Writes OUT_DIR/{plan.json, profile.yaml, cold/, warm/, uncapped/, summary.json} and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_run  # noqa: E402

PROFILE = "fit-h200"
PORT = 30000
# SGLang's own sizing lines: what the planner must predict to 1%.
SIZING = {"max_total_num_tokens": r"max_total_num_tokens=(\d+)", "max_running_requests": r"max_running_requests=(\d+)"}


def cli(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "ornith_stack", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"ornith-stack {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def cache_env(root: Path) -> dict[str, str]:
    """Every kernel and compile cache SGLang 0.5.17 and its libraries write, under one folder."""
    from ornith_stack import deployment  # the same variables compose and Helm point into their cache volume

    return {k: v.replace(deployment.COMPILE_CACHE_PATH, str(root)) for k, v in deployment.COMPILE_CACHE_ENV.items()}


def sizing(log: Path) -> dict[str, int]:
    import re

    text = log.read_text(errors="replace")
    found: dict[str, int] = {}
    for key, pattern in SIZING.items():
        m = re.findall(pattern, text)
        if m:
            found[key] = int(m[-1])
    return found


def start(cmd: list[str], out: Path, env: dict[str, str]) -> tuple[sglang_run.Engine, float]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    engine = sglang_run.Engine(cmd, out, PORT, env)
    healthy = engine.wait_healthy(out / "health.txt", 600)
    return engine, round(healthy, 1)


def bench(out: Path, levels: str) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, "-m", "ornith_stack", "bench", "--url", f"http://127.0.0.1:{PORT}", "--suite", "serving",
           "--random-input-len", "256", "--random-output-len", "128", "--max-concurrency", levels,
           "--num-prompts", "256", "--repeats", "3", "--warmup", "1", "--out", str(out / "bench")]  # fmt: skip
    with open(out / "bench.log", "wb") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=420, check=False)
    result = json.loads((out / "bench" / "bench.json").read_text())
    figures: dict[str, dict[str, float]] = {}
    for level in result["suites"]["serving"]["levels"]:
        spread = level.get("spread") or {}
        figures[str(level["max_concurrency"])] = {
            "output_tok_s": level.get("output_tok_s"),
            **{f"{k}_median": (spread.get(k) or {}).get("median") for k in ("ttft_ms_median", "tpot_ms_median")},
            "output_tok_s_spread": [(spread.get("output_tok_s") or {}).get(k) for k in ("min", "max")],
        }
    return figures


def alternate(args: argparse.Namespace) -> None:
    out: Path = args.out
    os.environ["ORNITH_PROFILE_DIR"] = str(out / "profiles")
    cenv = cache_env(out / "compile-cache")
    written, _ = sglang_run.engine_command(PROFILE, args.target, args.draft, PORT)
    uncapped, _ = sglang_run.engine_command(PROFILE, args.target, args.draft, PORT, "uncapped")
    rounds: list[dict] = []
    for n in range(args.alternate):
        for name, cmd, env in (("as_written", written, cenv), ("uncapped", uncapped, {**cenv, **sglang_run.ENV["uncapped"]})):
            engine, healthy = start(cmd, out / f"alt-{n}-{name}", env)
            try:
                figures = bench(out / f"alt-{n}-{name}", args.levels)
            finally:
                engine.stop()
            rounds.append({"round": n, "variant": name, "healthy_s": healthy, **figures})
            print(json.dumps(rounds[-1]), flush=True)
            time.sleep(3)
    (out / "alternate.json").write_text(json.dumps(rounds, indent=2) + "\n")


def main() -> None:
    # `timeout` stops this script with SIGTERM: leave through `finally`, so the engine goes with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--levels", default="32")
    ap.add_argument("--alternate", type=int, default=0, help="only N more rounds of as written / uncapped, "
                    "A B A B on the kept caches (a second look at the throughput comparison)")
    args = ap.parse_args()
    if args.alternate:
        alternate(args)
        return
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    profiles = out / "profiles"
    env = {"ORNITH_PROFILE_DIR": str(profiles)}
    os.environ.update(env)
    cli("profiles", "new", PROFILE, "--gpu", args.gpu, "--count", "1", "--out", str(out / "rendered"))
    shutil.copy(profiles / f"{PROFILE}.yaml", out / "profile.yaml")
    plan = json.loads(cli("plan", PROFILE, "--json", "--model-config", f"{args.target}/config.json",
                          "--draft-config", f"{args.draft}/config.json"))  # fmt: skip
    (out / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")

    cache = out / "compile-cache"
    shutil.rmtree(cache, ignore_errors=True)
    cenv = cache_env(cache)
    cmd, added = sglang_run.engine_command(PROFILE, args.target, args.draft, PORT)
    (out / "overrides.json").write_text(json.dumps(added, indent=2) + "\n")
    summary: dict = {"profile": PROFILE, "gpu": args.gpu, "cache_env": cenv, "command": cmd}

    engine, summary["cold_healthy_s"] = start(cmd, out / "cold", cenv)
    engine.stop()
    summary["engine_sizing"] = sizing(out / "cold" / "engine.log")
    time.sleep(5)
    engine, summary["warm_healthy_s"] = start(cmd, out / "warm", cenv)
    try:
        summary["as_written"] = bench(out / "warm", args.levels)
    finally:
        engine.stop()
    time.sleep(5)
    uncapped, removed = sglang_run.engine_command(PROFILE, args.target, args.draft, PORT, "uncapped")
    (out / "uncapped-overrides.json").write_text(json.dumps(removed, indent=2) + "\n")
    engine, summary["uncapped_healthy_s"] = start(uncapped, out / "uncapped", {**cenv, **sglang_run.ENV["uncapped"]})
    try:
        summary["uncapped"] = bench(out / "uncapped", args.levels)
    finally:
        engine.stop()
    summary["uncapped_sizing"] = sizing(out / "uncapped" / "engine.log")
    details = plan.get("engine_details", {})
    summary["plan"] = {k: details.get(k) for k in ("max_total_num_tokens", "max_running_requests",
                                                   "max_mamba_cache_size", "running_requests_capped_by")}  # fmt: skip
    summary["plan"]["verdict"] = plan.get("verdict")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary.get(k) for k in ("cold_healthy_s", "warm_healthy_s", "uncapped_healthy_s",
                                                   "engine_sizing", "uncapped_sizing", "plan")}, indent=1))  # fmt: skip
    for level, ours in summary["as_written"].items():
        ref = summary["uncapped"].get(level, {})
        ratio = (ours.get("output_tok_s") or 0) / ref["output_tok_s"] if ref.get("output_tok_s") else None
        print(f"concurrency {level}: as written {ours} | uncapped {ref} | ratio {ratio and round(ratio, 3)}")


if __name__ == "__main__":
    main()
