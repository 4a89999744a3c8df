"""Start SGLang from the project's launch args, drive it, and record what it answers and logs.

    python3 tests/gpu/sglang_run.py PROFILE OUT_DIR --target T --draft D [--port 30000]

Used by tests/gpu/test_sglang_h200.py (`pytest -m gpu` on the H200 machine) and run_sglang_h200.sh.
Stdlib only besides the project itself (it runs on the GPU machine). The engine command is
`ornith-stack launch-args PROFILE` with the model paths set to the tiny checkpoints plus OVERRIDES,
each with the reason the tiny model or the test machine forces it. Writes into OUT_DIR:

  command.txt, overrides.json   the engine command line, and what was added to the launch args
  health.txt                    every /health answer from start to healthy: seconds, status, body
  engine.log, key-lines.txt     the server log, and its memory/sizing lines
  metrics-idle.txt              /metrics once healthy, before any request
  server_info-idle.json         /server_info then; models.json (/v1/models)
  generate.json                 native /generate answers (meta_info.spec_verify_ct per request)
  metrics-during-N.txt          /metrics while a long generation runs (and exporter-metrics-during-N.txt)
  metrics-after.txt             /metrics after it (and exporter-metrics-after.txt, server_info-after.json)
  bench/, bench.log             a short `ornith-stack bench` run
  exporter-metrics-final.txt    the exporter after the bench; metrics-final.txt the engine's
  chat-meta-info.json           a non-streaming /v1/chat/completions with return_meta_info (the route the
                                bench's seed 004 method reads per-request steps from), and
                                metrics-after-chat.txt, /metrics after it
  summary.json                  start-up seconds, the key lines, acceptance per request and overall

The `uncapped` variant drops the profile's --max-total-tokens and --max-running-requests (SGLang then
sizes the KV pool from memory and clamps running requests itself) and runs the bench's seed 004 method
(thinking on, dflash prompts, up to 4,096 new tokens) instead of the long generation and the speed bench.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

# What the tiny model or the test machine forces on top of the profile's launch args, each with its
# reason (measured on the H200 machine, 2026-11-30); the README of the fixtures repeats them.
OVERRIDES: dict[str, list[tuple[list[str], str]]] = {
    "common": [
        (["--attention-backend", "triton"], "FA3 kernels (sgl_kernel/flash_ops, 1.12 GB) are not carried; triton is what an A100 uses"),
        (["--sampling-backend", "pytorch"], "flashinfer's sampling kernels would JIT-compile; not needed for greedy decoding"),
        (["--grammar-backend", "none"], "no structured output is requested; xgrammar's kernels are not exercised"),
    ],
    "tp2": [
        (["--disable-prefill-cuda-graph"], "tp 2 spends over 6 minutes capturing prefill CUDA graphs (measured on the H200)"),
    ],
    "uncapped": [
        (["--context-length", "16384"], "seed 004 asks up to 4,096 new tokens; the tiny model has 4,096 positions "
         "(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 lets SGLang serve more)"),
    ],
}  # fmt: skip
# Flags of the launch args a variant removes (with their values), and why.
REMOVED: dict[str, list[tuple[str, str]]] = {
    "uncapped": [
        ("--max-total-tokens", "the KV pool is sized by SGLang from memory: the planner must predict it"),
        ("--max-running-requests", "SGLang resolves running requests itself (DFlash's 48, the state-slot clamp)"),
    ],
}
ENV: dict[str, dict[str, str]] = {"uncapped": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}}
# Lines of the server log the planner is checked against, and the start-up milestones.
KEY_LINES = re.compile(
    r"Mamba Cache is allocated|KV Cache is allocated|max_total_num_tokens|max_running_requests|"
    r"Load weight end|Memory pool end|Capture .*cuda graph|mem usage|avail mem|mamba|DFLASH|dflash|"
    r"The server is fired up|Application startup complete|Traceback|Error"
)
PROMPT = "Repeat exactly, forty times: the cat sat on the mat. the cat sat on the mat."


def _get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def engine_command(profile: str, target: str, draft: str, port: int, variant: str = "") -> tuple[list[str], list[dict]]:
    out = subprocess.run(
        [sys.executable, "-m", "ornith_stack", "launch-args", profile, "--json", "--host", "127.0.0.1",
         "--port", str(port), "--set", f"model.repo={target}", "--set", f"draft.repo={draft}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    cmd = json.loads(out)
    tp = cmd[cmd.index("--tp-size" if "--tp-size" in cmd else "--tp") + 1]
    added = OVERRIDES["common"] + (OVERRIDES["tp2"] if tp == "2" else []) + OVERRIDES.get(variant, [])
    removed = []
    for flag, why in REMOVED.get(variant, []):
        if flag in cmd:
            i = cmd.index(flag)
            removed.append({"removed": cmd[i : i + 2], "why": why})
            del cmd[i : i + 2]
    for flags, _ in added:
        cmd += flags
    cmd[0] = sys.executable
    return cmd, [{"flags": f, "why": why} for f, why in added] + removed


class Engine:
    def __init__(self, cmd: list[str], out: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(out / "engine.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
        self.t0 = time.monotonic()

    def wait_healthy(self, health: Path, deadline_s: float) -> float:
        with open(health, "w") as h:
            while time.monotonic() - self.t0 < deadline_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine exited with {self.proc.returncode}")
                try:
                    code, body = _get(f"{self.base}/health", timeout=2)
                except OSError as e:
                    code, body = 0, repr(e).encode()
                h.write(f"{time.monotonic() - self.t0:.1f}\t{code}\t{body[:120]!r}\n")
                h.flush()
                if code == 200:
                    return time.monotonic() - self.t0
                time.sleep(1)
        raise RuntimeError(f"not healthy after {deadline_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def _save(path: Path, url: str) -> bytes:
    """What `url` answered, into `path`; a fetch that failed leaves a note there instead (the recording goes on)."""
    try:
        code, body = _get(url)
    except OSError as exc:
        body = f"# fetching {url} failed: {exc!r}\n".encode()
    path.write_bytes(body)
    return body


def generate(base: str, max_new_tokens: int, prompt: str = PROMPT) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    r = _post(f"{base}/generate", body)
    meta = r["meta_info"]
    return {
        k: meta.get(k) for k in ("prompt_tokens", "completion_tokens", "spec_verify_ct", "e2e_latency", "finish_reason")
    }


def chat_meta_info(base: str, model: str) -> dict:
    """One non-streaming chat completion asking for SGLang's meta_info (return_meta_info), thinking off."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 200,
        "temperature": 0,
        "return_meta_info": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    return _post(f"{base}/v1/chat/completions", body)


def long_generation(base: str, out: Path, exporter: str | None, max_new_tokens: int, streams: int) -> list[dict]:
    """`streams` concurrent greedy generations; /metrics (engine and exporter) scraped every second meanwhile."""
    results: list[dict] = []

    def one() -> None:
        results.append(generate(base, max_new_tokens))

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for t in threads:
        t.start()
    n = 0
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        n += 1
        _save(out / f"metrics-during-{n:02d}.txt", f"{base}/metrics")
        if exporter:
            _save(out / f"exporter-metrics-during-{n:02d}.txt", f"{exporter}/metrics")
    for t in threads:
        t.join()
    return results


def key_lines(log: Path) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return [line[:600] for line in text.splitlines() if KEY_LINES.search(line)]


def start_exporter(engine: str, port: int, out: Path) -> subprocess.Popen | None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ornith_stack", "exporter", "--target", engine, "--listen", f"127.0.0.1:{port}"],
        stdout=open(out / "exporter.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    for _ in range(30):
        try:
            if _get(f"http://127.0.0.1:{port}/metrics", timeout=5)[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(1)
    return proc


BENCH = {
    "": ["--suite", "decode,concurrency", "--max-tokens", "256", "--samples", "3", "--warmup", "1",
         "--concurrency", "1,4"],
    # Seed 004's method on one problem per task (5 tasks, each at concurrency 1, 8 and 32); the tiny
    # model's code answers run unconfined (no bubblewrap on the GPU machine, which is discarded after).
    "uncapped": ["--method", "seed004", "--task-limit", "1", "--warmup", "1", "--unsafe-run-code-without-sandbox"],
}  # fmt: skip


def bench(engine: str, out: Path, variant: str = "", timeout_s: float = 150) -> int:
    cmd = [sys.executable, "-m", "ornith_stack", "bench", "--url", engine, "--out", str(out / "bench"), *BENCH[variant]]
    with open(out / "bench.log", "wb") as log:
        try:
            return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return -1


def record(profile: str, out: Path, target: str, draft: str, port: int = 30000, exporter_port: int = 9400,
           health_deadline_s: float = 420, variant: str = "") -> dict:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    cmd, added = engine_command(profile, target, draft, port, variant)
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    (out / "overrides.json").write_text(json.dumps(added, indent=2) + "\n")
    summary: dict = {
        "profile": profile,
        "variant": variant,
        "command": cmd,
        "overrides": added,
        "env": ENV.get(variant, {}),
    }
    engine = Engine(cmd, out, port, ENV.get(variant))
    exporter_proc = None
    try:
        summary["healthy_after_s"] = round(engine.wait_healthy(out / "health.txt", health_deadline_s), 1)
        base = engine.base
        _save(out / "metrics-idle.txt", f"{base}/metrics")
        _save(out / "server_info-idle.json", f"{base}/server_info")
        _save(out / "models.json", f"{base}/v1/models")
        exporter_proc = start_exporter(base, exporter_port, out)
        exporter = f"http://127.0.0.1:{exporter_port}"
        _save(out / "exporter-metrics-idle.txt", f"{exporter}/metrics")
        summary["generate"] = [generate(base, n) for n in (16, 64, 256, 256)]
        summary["long_generation"] = [] if variant else long_generation(base, out, exporter, 3000, 2)
        time.sleep(2)
        _save(out / "metrics-after.txt", f"{base}/metrics")
        _save(out / "exporter-metrics-after.txt", f"{exporter}/metrics")
        _save(out / "server_info-after.json", f"{base}/server_info")
        (out / "generate.json").write_text(
            json.dumps(summary["generate"] + summary["long_generation"], indent=2) + "\n"
        )
        model = json.loads((out / "models.json").read_text())["data"][0]["id"]
        try:
            chat = chat_meta_info(base, model)
        except (OSError, ValueError) as e:  # recorded, and the test says so; the bench still runs
            chat = {"error": repr(e)}
        (out / "chat-meta-info.json").write_text(json.dumps(chat, indent=2) + "\n")
        time.sleep(2)
        _save(out / "metrics-after-chat.txt", f"{base}/metrics")
        summary["bench_rc"] = bench(base, out, variant, 480 if variant else 150)
        time.sleep(2)
        _save(out / "exporter-metrics-final.txt", f"{exporter}/metrics")
        _save(out / "metrics-final.txt", f"{base}/metrics")
    finally:
        if exporter_proc is not None:
            os.killpg(exporter_proc.pid, signal.SIGTERM)
        engine.stop()
        lines = key_lines(out / "engine.log")
        (out / "key-lines.txt").write_text("\n".join(lines) + "\n")
        summary["key_lines"] = lines
        reqs = summary.get("generate", []) + summary.get("long_generation", [])
        tokens = sum(r["completion_tokens"] for r in reqs)
        verify = sum(r["spec_verify_ct"] or 0 for r in reqs)
        summary["acceptance_length"] = round(tokens / verify, 4) if verify else None
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--variant", default="", choices=sorted(BENCH))
    args = ap.parse_args()
    s = record(args.profile, args.out, args.target, args.draft, args.port, variant=args.variant)
    print(json.dumps({k: s.get(k) for k in ("healthy_after_s", "acceptance_length", "bench_rc")}))


if __name__ == "__main__":
    main()
