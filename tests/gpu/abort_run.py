"""GPU recording for issue 33: SGLang's `sglang:num_aborted_requests_total` moving, beside the exporter with --canary.

One uncapped gpu96 engine (as bench_peer_run.py); eight streamed chats of 2,000 tokens, each read for 0.3 s and
then dropped (the client goes away), and four more ended by SGLang's own `POST /abort_request {"abort_all": true}`;
the engine's /metrics before and after, the exporter's /metrics and its log go to OUT.

    python3 tests/gpu/abort_run.py OUT --target MODELS/target --draft MODELS/draft --compile-cache DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_peer_run  # noqa: E402
import sglang_run  # noqa: E402
from fit_run import cache_env  # noqa: E402


def stream(base: str, model: str, read_s: float, log: list[dict]) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Count from one to a thousand."}],
            "max_tokens": 2000, "stream": True, "ignore_eos": True, "temperature": 0}  # fmt: skip
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    t0, lines = time.monotonic(), 0
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            while time.monotonic() - t0 < read_s and response.readline():
                lines += 1
    except OSError as exc:
        log.append({"error": repr(exc)})
    log.append({"lines_read": lines, "closed_after_s": round(time.monotonic() - t0, 3)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--compile-cache", type=Path, required=True)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cmd, _ = sglang_run.engine_command("gpu96", args.target, args.draft, 30000, "uncapped")
    engine = sglang_run.Engine(cmd, out, 30000, {**sglang_run.ENV["uncapped"], **cache_env(args.compile_cache)})
    try:
        print(f"healthy after {engine.wait_healthy(out / 'health.txt', 300):.0f} s", flush=True)
        base = engine.base
        model = json.loads(sglang_run._get(f"{base}/v1/models")[1])["data"][0]["id"]
        sglang_run._save(out / "metrics-before.txt", f"{base}/metrics")
        log: list[dict] = []
        dropped = [threading.Thread(target=stream, args=(base, model, 0.3, log)) for _ in range(8)]
        for t in dropped:
            t.start()
        for t in dropped:
            t.join()
        time.sleep(2)
        ended = [threading.Thread(target=stream, args=(base, model, 30, log)) for _ in range(4)]
        for t in ended:
            t.start()
        time.sleep(1.0)
        abort = urllib.request.Request(f"{base}/abort_request", data=json.dumps({"abort_all": True}).encode(),
                                       headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(abort, timeout=30) as response:
            log.append({"abort_request": response.status})
        for t in ended:
            t.join()
        time.sleep(2)
        (out / "clients.json").write_text(json.dumps(log, indent=1))
        sglang_run._save(out / "metrics-after.txt", f"{base}/metrics")
        print([line for line in (out / "metrics-after.txt").read_text().splitlines() if "abort" in line], flush=True)
        bench_peer_run.record_canary(base, out)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
