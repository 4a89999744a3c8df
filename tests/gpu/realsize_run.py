"""Real-size GPU recordings (issue 40): the Ornith 35B at its real shapes without its weights, on the lent H200.

    python3 tests/gpu/realsize_run.py shapes MODELS                       # make MODELS/real-{target,draft}
    python3 tests/gpu/realsize_run.py seed000 OUT --models MODELS         # seed 000's table in shape
    python3 tests/gpu/realsize_run.py computed OUT --models MODELS        # the computed 1x H200 profile
    python3 tests/gpu/realsize_run.py compare OUT --models MODELS         # seed caps / SGLang's defaults

Both engines start a checkpoint's real shapes without its weights (`--load-format dummy`: random weights
initialised on the GPU from config.json; the tokenizer is the only other file read), and SGLang 0.5.17's DFlash
verify step accepts SGLANG_SIMULATE_ACC_LEN tokens whatever the draft proposed (`dflash_utils.py`,
`apply_dflash_simulated_acceptance`; `match-expected` draws the two lengths around the mean). So every figure
here is the real model's compute and memory at a chosen acceptance length: seed 000's measured 6.1 (GSM8K) and
7.7 (HumanEval). What it cannot show: the acceptance a real draft reaches on real prompts.

`shapes`: the real-shape folders are the tiny checkpoints (tests' `tiny-model --with-vision` and
make_dflash_draft.py, already on the machine) with the real structural keys of the project's shape files
(`sizing/configs/ornith-1.5-35b-a3b.json`, `qwen3.5-35b-a3b-dflash.json`) laid over their config.json, the
rotary sections scaled to the real head size, and the tiny byte-level tokenizer's vocabulary extended to the real
248,320 entries (every id the random model can emit decodes to text: ` w<id>`). No weight file is written.

Every engine starts from `ornith-stack launch-args PROFILE` (sglang_run.engine_command, the same overrides as every
recording: triton attention, pytorch sampling, no grammar backend) plus `--load-format dummy`; what each part
adds or removes is in its `changes.json`. Each part writes OUT/<variant>/ (command, engine.log, health.txt,
key-lines.txt, bench/) and OUT/summary.json, and prints one JSON line per variant and a table at the end.

- seed000: the gpu96 profile (seed 000's tp 1 command: 4 running requests, 40,960 KV tokens): without speculation
  (the `--speculative-*` flags removed), then DFlash block 16 at acceptance 6.1 and 7.7; `ornith-stack bench
  --suite decode` single stream, 640-token generations. Speedup = DFlash / base, beside seed 000's 202.5 and 470.2
  tok/s (2.32x, 2x A100) and the H200's roofline (bench/roofline.py).
- computed: `profiles new h200x1 --gpu h200 --count 1` (the profile a user gets), `plan h200x1 --json` on the real
  shapes, the engine with EMPTY compile caches (cold healthy seconds), its logged KV tokens / running requests /
  state slots beside the plan; again with the caches kept (warm), then the serving bench at 1, 8, 32 and the
  profile's running-request limit, acceptance 6.1.
- refusal (one H100): the planner's word on the 35B at tp 1 (`profiles new --gpu h100-sxm`), then gpu96 started
  anyway at real shapes: where SGLang itself stops, and its line.
- compare: the same serving bench on gpu96 as written (seed 000's caps) and on gpu96 without its two caps (SGLang's
  own sizing: the `uncapped` variant), acceptance 6.1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_run  # noqa: E402
from fit_run import cache_env, cli, sizing  # noqa: E402

PORT = 30000
REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "src" / "ornith_stack" / "sizing" / "configs"
TARGET_SHAPE, DRAFT_SHAPE = "ornith-1.5-35b-a3b.json", "qwen3.5-35b-a3b-dflash.json"
SEED000 = {"base_tok_s": 202.5, "dflash_tok_s": 470.2, "speedup": 2.32, "hardware": "2x A100 80GB, tp 2"}
DUMMY = (["--load-format", "dummy"], "real shapes without weights: random weights from config.json (no download)")
# Keys of the shape files that are not structure: the tiny checkpoints' own values stay (token ids, model types).
NO_INDEX = "model.safetensors.index.json"
KEEP = {"model_type", "dtype", "architectures", "_ornith_provenance", "_ornith_inferred", "tie_word_embeddings"}


# -- the real-shape checkpoints -------------------------------------------------------------------------------


def _overlay(tiny: dict, shape: dict) -> dict:
    out = dict(tiny)
    for key, value in shape.items():
        if key in KEEP:
            continue
        out[key] = _overlay(tiny.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _rotary_sections(text: dict) -> None:
    """mrope_section splits head_dim x partial_rotary_factor / 2 rotary pairs over (t, h, w): 64 dims -> 11, 11, 10."""
    rope = text.get("rope_parameters") or {}
    if "mrope_section" in rope:
        pairs = int(text["head_dim"] * rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))) // 2
        third = -(-pairs // 3)
        rope["mrope_section"] = [third, third, pairs - 2 * third]


def _extend_vocabulary(tiny: Path, out: Path, size: int) -> None:
    """The tiny byte-level BPE with ids up to `size`: ` w<id>` tokens no merge reaches, so any id decodes to text."""
    data = json.loads((tiny / "tokenizer.json").read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in data.get("added_tokens", [])}
    for i in range(size):
        if i not in taken:
            vocab[f"\u0120w{i}"] = i  # U+0120 is the byte-level alphabet's space
    (out / "tokenizer.json").write_text(json.dumps(data))


def make_shapes(models: Path) -> dict[str, Path]:
    target_text = json.loads((CONFIGS / TARGET_SHAPE).read_text())["text_config"]
    made = {}
    for name, shape_file in (("target", TARGET_SHAPE), ("draft", DRAFT_SHAPE)):
        tiny, real = models / name, models / f"real-{name}"
        shutil.rmtree(real, ignore_errors=True)
        real.mkdir(parents=True)
        for f in tiny.iterdir():  # everything but the weights, their index and what is rewritten below
            if f.suffix != ".safetensors" and f.name not in ("config.json", "tokenizer.json", NO_INDEX):
                shutil.copy(f, real / f.name)
        tiny_config = json.loads((tiny / "config.json").read_text())
        config = _overlay(tiny_config, json.loads((CONFIGS / shape_file).read_text()))
        if name == "target":
            _rotary_sections(config["text_config"])
            vocab = config["text_config"]["vocab_size"]
        else:  # the draft reads the target's hidden states and keeps the tiny tokenizer's mask token
            vocab = config["vocab_size"]
            config["target_hidden_size"] = target_text["hidden_size"]
            config["num_target_layers"] = target_text["num_hidden_layers"]
            config["dflash_config"]["mask_token_id"] = tiny_config["dflash_config"]["mask_token_id"]
        (real / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if (tiny / "tokenizer.json").exists():  # the draft has none: SGLang reads the target's
            _extend_vocabulary(tiny, real, vocab)
        made[name] = real
    return made


# -- engines and measurements ---------------------------------------------------------------------------------


def engine(profile: str, models: Path, variant: str = "", drop_spec: bool = False) -> tuple[list[str], list[dict]]:
    cmd, changes = sglang_run.engine_command(profile, str(models / "real-target"), str(models / "real-draft"), PORT,
                                             variant)  # fmt: skip
    if "--context-length" in cmd:  # the tiny model's 16,384 of the `uncapped` variant: the real shape has 262,144
        i = cmd.index("--context-length")
        del cmd[i : i + 2]
        changes = [c for c in changes if "--context-length" not in c.get("flags", [])]
    if drop_spec:
        kept, dropped = [], []
        i = 0
        while i < len(cmd):
            if cmd[i].startswith("--speculative-"):
                n = 2 if i + 1 < len(cmd) and not cmd[i + 1].startswith("--") else 1
                dropped += cmd[i : i + n]
                i += n
            else:
                kept.append(cmd[i])
                i += 1
        cmd = kept
        changes.append({"removed": dropped, "why": "the base row of seed 000's table: no speculation"})
    cmd += DUMMY[0]
    changes.append({"flags": DUMMY[0], "why": DUMMY[1]})
    return cmd, changes


def acceptance_env(acceptance: float | None) -> dict[str, str]:
    return {} if acceptance is None else {"SGLANG_SIMULATE_ACC_LEN": str(acceptance)}


def weight_line(log: Path) -> str | None:
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    lines = [line for line in text.splitlines() if "Load weight end" in line]
    return lines[-1][-300:] if lines else None


def run_bench(out: Path, args: list[str], timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "ornith_stack", "bench", "--url", f"http://127.0.0.1:{PORT}", "--out", str(out), *args]
    with open(out.with_suffix(".log"), "wb") as log:
        try:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"bench timed out after {timeout_s} s"}
    try:
        return json.loads((out / "bench.json").read_text())
    except (OSError, ValueError) as exc:
        return {"error": repr(exc)}


def decode_figures(result: dict) -> dict:
    suite = (result.get("suites") or {}).get("decode") or {}
    pick = lambda s: (s or {}).get("median")  # noqa: E731
    return {"decode_tok_s": pick(suite.get("decode_tok_s")), "engine_decode_tok_s": pick(suite.get("engine_decode_tok_s")),
            "ttft_s": pick(suite.get("ttft_s")), "acceptance": suite.get("acceptance_length"), "error": result.get("error")}  # fmt: skip


def serving_figures(result: dict) -> dict:
    entry = (((result.get("suites") or {}).get("serving") or {}).get("levels") or [{}])[0]
    spread = entry.get("spread") or {}
    return {
        "output_tok_s": entry.get("output_tok_s"),
        "ttft_ms_median": (spread.get("ttft_ms_median") or {}).get("median"),
        "tpot_ms_median": (spread.get("tpot_ms_median") or {}).get("median"),
        "errors": entry.get("errors"),
        "error": result.get("error"),
    }


def serving(out: Path, levels: list[int]) -> dict[str, dict]:
    """The serving suite level by level, prompts scaled with the level (8 x c, at least 8): 256 in, 128 out."""
    figures: dict[str, dict] = {}
    for level in levels:
        result = run_bench(out / f"serving-c{level}", ["--suite", "serving", "--random-input-len", "256",
                           "--random-output-len", "128", "--max-concurrency", str(level), "--num-prompts",
                           str(max(8, 8 * level)), "--repeats", "2", "--warmup", "1"], 240)  # fmt: skip
        figures[str(level)] = serving_figures(result)
        print(f"  concurrency {level}: {json.dumps(figures[str(level)])}", flush=True)
    return figures


def attempt(
    out: Path, name: str, cmd: list[str], changes: list[dict], env: dict[str, str], measure: Callable[[Variant], None]
) -> dict:
    """Start one variant, measure it, stop it; a start that fails is recorded (its `failed` and log lines)."""
    v = Variant(out, name, cmd, changes, env)
    try:
        with v:
            measure(v)
    except RuntimeError:
        pass
    return v.figures


class Variant:
    """One engine: started, recorded, stopped; what it logged and measured lands in summary[name]."""

    def __init__(self, out: Path, name: str, cmd: list[str], changes: list[dict], env: dict[str, str]) -> None:
        self.dir = out / name
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "command.txt").write_text(" ".join(cmd) + "\n")
        (self.dir / "changes.json").write_text(json.dumps({"changes": changes, "env": env}, indent=1) + "\n")
        self.name, self.cmd, self.env = name, cmd, env
        self.figures: dict = {"variant": name, "env": {k: v for k, v in env.items() if k.startswith("SGLANG_")}}

    def __enter__(self) -> Variant:
        self.engine = sglang_run.Engine(self.cmd, self.dir, PORT, self.env)
        try:
            self.figures["healthy_s"] = round(self.engine.wait_healthy(self.dir / "health.txt", 540), 1)
        except RuntimeError as exc:  # recorded with the engine's last lines; the part goes on to its next variant
            self.figures["failed"] = str(exc)
            self._close()
            print(json.dumps(self.figures), flush=True)
            raise
        return self

    def _close(self) -> None:
        self.engine.stop()
        log = self.dir / "engine.log"
        lines = sglang_run.key_lines(log)
        (self.dir / "key-lines.txt").write_text("\n".join(lines) + "\n")
        self.figures["sizing"] = sizing(log)
        slots = re.findall(r"max_mamba_cache_size: (\d+)", log.read_text(errors="replace"))
        if slots:
            self.figures["sizing"]["max_mamba_cache_size"] = int(slots[-1])
        self.figures["weights"] = weight_line(log)
        errors = [line for line in lines if "Error" in line or "Traceback" in line]
        if errors:
            self.figures["log_errors"] = errors[-3:]

    def __exit__(self, *exc: object) -> None:
        self._close()
        print(json.dumps(self.figures), flush=True)
        time.sleep(3)


def roofline() -> dict:
    """The H200's single-stream decode ceiling for the 35B (bench/roofline.py: weights read once per token)."""
    from ornith_stack import gpus  # noqa: PLC0415
    from ornith_stack.bench.roofline import roofline_from_shape  # noqa: PLC0415
    from ornith_stack.sizing.shapes import load_shape  # noqa: PLC0415

    h200 = gpus.lookup("h200")
    line = roofline_from_shape(load_shape(TARGET_SHAPE.removesuffix(".json")), h200.memory_bandwidth_gbps, "h200")
    return line.to_json()


def part_seed000(out: Path, models: Path, cenv: dict[str, str]) -> dict:
    summary: dict = {"part": "seed000", "seed000": SEED000, "variants": []}
    plan = [("base", None, True), ("dflash-6.1", 6.1, False), ("dflash-7.7", 7.7, False)]
    for name, acceptance, drop in plan:
        cmd, changes = engine("gpu96", models, drop_spec=drop)

        def decode(v: Variant) -> None:
            result = run_bench(v.dir / "decode", ["--suite", "decode", "--max-tokens", "640", "--samples", "4",
                                                  "--warmup", "1"], 240)  # fmt: skip
            v.figures.update(decode_figures(result))

        summary["variants"].append(attempt(out, name, cmd, changes, {**cenv, **acceptance_env(acceptance)}, decode))
    base = summary["variants"][0].get("decode_tok_s")
    for v in summary["variants"][1:]:
        v["speedup"] = round(v["decode_tok_s"] / base, 3) if base and v.get("decode_tok_s") else None
    return summary


def part_computed(out: Path, models: Path, cenv_root: Path) -> dict:
    profiles = out / "profiles"
    os.environ["ORNITH_PROFILE_DIR"] = str(profiles)
    cli("profiles", "new", "h200x1", "--gpu", "h200", "--count", "1", "--out", str(out / "rendered"))
    shutil.copy(profiles / "h200x1.yaml", out / "profile.yaml")
    plan = json.loads(cli("plan", "h200x1", "--json", "--model-config", str(models / "real-target" / "config.json"),
                          "--draft-config", str(models / "real-draft" / "config.json")))  # fmt: skip
    (out / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    details = plan.get("engine_details", {})
    summary: dict = {"part": "computed", "plan": {k: details.get(k) for k in ("max_total_num_tokens", "max_running_requests",
                     "max_mamba_cache_size", "running_requests_capped_by")}, "variants": []}  # fmt: skip
    summary["plan"]["verdict"] = plan.get("verdict")
    limit = int(details.get("max_running_requests") or 32)
    cold_cache = cenv_root.parent / "compile-cache-cold"
    shutil.rmtree(cold_cache, ignore_errors=True)
    cmd, changes = engine("h200x1", models)
    env = {**cache_env(cold_cache), **acceptance_env(6.1)}
    summary["variants"].append(attempt(out, "cold", cmd, changes, env, lambda v: None))

    def bench(v: Variant) -> None:
        v.figures["serving"] = serving(v.dir, sorted({1, 8, 32, limit}))

    summary["variants"].append(attempt(out, "warm", cmd, changes, env, bench))
    engine_sizing = summary["variants"][0].get("sizing", {})
    summary["planner_error"] = {
        k: round((summary["plan"][k] - engine_sizing[k]) / engine_sizing[k], 5)
        for k in ("max_total_num_tokens", "max_running_requests", "max_mamba_cache_size")
        if summary["plan"].get(k) and engine_sizing.get(k)
    }
    return summary


def part_compare(out: Path, models: Path, cenv: dict[str, str], levels: list[int]) -> dict:
    summary: dict = {"part": "compare", "variants": []}
    for name, variant in (("seed-caps", ""), ("sglang-defaults", "uncapped")):
        cmd, changes = engine("gpu96", models, variant)
        env = {**cenv, **sglang_run.ENV.get(variant, {}), **acceptance_env(6.1)}

        def bench(v: Variant) -> None:
            limit = sizing(v.dir / "engine.log").get("max_running_requests") or 4
            v.figures["serving"] = serving(v.dir, sorted({*levels, limit}))

        summary["variants"].append(attempt(out, name, cmd, changes, env, bench))
    return summary


# -- the tables, rebuilt from what each run recorded (tests/unit/test_realsize_recordings.py) --------------------


def _bench(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def healthy_s(variant: Path) -> float | None:
    for row in (variant / "health.txt").read_text().splitlines() if (variant / "health.txt").exists() else []:
        t, code, *_ = row.split("\t")
        if code == "200":
            return float(t)
    return None


def recorded(variant: Path) -> dict:
    """One variant's figures from its files: health.txt, engine.log, decode/ and serving-c*/ bench.json."""
    log = variant / "engine.log"
    found: dict = {"healthy_s": healthy_s(variant), "sizing": sizing(log) if log.exists() else {}}
    text = log.read_text(errors="replace") if log.exists() else ""
    slots = re.findall(r"max_mamba_cache_size: (\d+)", text)
    if slots:
        found["sizing"]["max_mamba_cache_size"] = int(slots[-1])
    loads = dict(re.findall(r"Load weight end.*?type=(\w+).*?mem usage=([\d.]+) GB", text))
    found["draft_weights_gb"] = float(loads.pop("DFlashDraftModel")) if "DFlashDraftModel" in loads else None
    found["weights_gb"] = float(next(iter(loads.values()))) if loads else None  # the target's
    if (variant / "decode" / "bench.json").exists():
        found.update(decode_figures(_bench(variant / "decode" / "bench.json")))
    levels = sorted(int(d.name.removeprefix("serving-c")) for d in variant.glob("serving-c*") if d.is_dir())
    if levels:
        found["serving"] = {str(c): serving_figures(_bench(variant / f"serving-c{c}" / "bench.json")) for c in levels}
    return found


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(root: Path) -> str:
    """Markdown tables of every recorded part under `root` (realsize-seed000/, -computed/, -compare/)."""
    out: list[str] = []
    seed = root / "realsize-seed000"
    if seed.is_dir():
        rows = {name: recorded(seed / name) for name in ("base", "dflash-6.1", "dflash-7.7") if (seed / name).is_dir()}
        base = (rows.get("base") or {}).get("decode_tok_s")
        out += ["### Seed 000's table at real shapes (one H200, tp 1, gpu96; 640-token generations, one stream)", "",
                "| run | decode tok/s | speedup | engine decode tok/s | TTFT s | acceptance | healthy s |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, r in rows.items():
            speedup = r["decode_tok_s"] / base if base and r.get("decode_tok_s") else None
            out.append(f"| {name} | {_f(r.get('decode_tok_s'))} | {_f(speedup, 2)}x | {_f(r.get('engine_decode_tok_s'))} "
                       f"| {_f(r.get('ttft_s'), 3)} | {_f(r.get('acceptance'), 2)} | {_f(r.get('healthy_s'))} |")  # fmt: skip
        out += [f"| seed 000 (2x A100, tp 2) | {SEED000['base_tok_s']} -> {SEED000['dflash_tok_s']} | "
                f"{SEED000['speedup']}x | | | 6.1 / 7.7 | |",
                f"| H200 roofline (weights read once a token, bench/roofline.py) | {_f(roofline()['tok_s'])} | | | | | |",
                ""]  # fmt: skip
    computed = root / "realsize-computed"
    if computed.is_dir():
        plan = _bench(computed / "plan.json").get("engine_details", {})
        cold = recorded(computed / "cold")
        out += ["### The computed 1x H200 profile: the engine's own sizing beside `plan`", "",
                "| figure | plan | engine (cold start) | planner error |", "|---|---|---|---|"]  # fmt: skip
        for key in ("max_total_num_tokens", "max_running_requests", "max_mamba_cache_size"):
            mine, theirs = plan.get(key), cold["sizing"].get(key)
            err = f"{100 * (mine - theirs) / theirs:+.2f}%" if mine and theirs else "-"
            out.append(f"| {key} | {_f(mine, 0)} | {_f(theirs, 0)} | {err} |")
        warm = recorded(computed / "warm")
        out += [f"| weights in memory GiB (engine: target / draft) | | {_f(cold.get('weights_gb'), 2)} / "
                f"{_f(cold.get('draft_weights_gb'), 2)} | |",
                f"| healthy s, empty / kept compile caches | | {_f(cold.get('healthy_s'))} / "
                f"{_f(warm.get('healthy_s'))} | |", ""]  # fmt: skip
    serving_rows: list[tuple[str, dict]] = []
    if computed.is_dir():
        serving_rows.append(("computed h200x1", recorded(computed / "warm")))
    compare = root / "realsize-compare"
    for name in ("seed-caps", "sglang-defaults"):
        if (compare / name).is_dir():
            serving_rows.append((f"gpu96 {name}", recorded(compare / name)))
    if serving_rows:
        out += ["### Serving at real shapes, acceptance 6.1 (256 in, 128 out; output tok/s, median TTFT ms, median TPOT ms)",
                "", "| profile | running limit | concurrency | output tok/s | TTFT ms | TPOT ms | errors |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, r in serving_rows:
            for level, fig in (r.get("serving") or {}).items():
                out.append(f"| {name} | {_f(r['sizing'].get('max_running_requests'), 0)} | {level} | "
                           f"{_f(fig.get('output_tok_s'))} | {_f(fig.get('ttft_ms_median'))} | "
                           f"{_f(fig.get('tpot_ms_median'), 2)} | {fig.get('errors')} |")  # fmt: skip
        out.append("")
    return "\n".join(out)


def part_refusal(out: Path, models: Path, cenv: dict[str, str]) -> dict:
    """On a card the planner refuses (one H100: no room for one DFlash request at tp 1), what SGLang itself says at
    real size; then what fits it: gpu96 without speculation, and DFlash with the static pool raised to 0.93."""
    refused = subprocess.run([sys.executable, "-m", "ornith_stack", "profiles", "new", "h100x1", "--gpu", "h100-sxm",
                              "--count", "1", "--out", str(out / "rendered")], capture_output=True, text=True,
                             env={**os.environ, "ORNITH_PROFILE_DIR": str(out / "profiles")})  # fmt: skip
    summary: dict = {"part": "refusal", "planner": (refused.stdout + refused.stderr).strip(), "variants": []}
    print(summary["planner"], flush=True)
    cmd, changes = engine("gpu96", models)
    summary["variants"].append(attempt(out, "gpu96", cmd, changes, {**cenv, **acceptance_env(6.1)}, lambda v: None))
    text = re.sub(r"\x1b\[[0-9;]*m", "", (out / "gpu96" / "engine.log").read_text(errors="replace"))
    summary["engine_last_lines"] = [line[:400] for line in text.splitlines()[-12:]]
    print("\n".join(summary["engine_last_lines"]), flush=True)

    def decode(v: Variant) -> None:
        result = run_bench(v.dir / "decode", ["--suite", "decode", "--max-tokens", "640", "--samples", "4",
                                              "--warmup", "1"], 240)  # fmt: skip
        v.figures.update(decode_figures(result))

    cmd, changes = engine("gpu96", models, drop_spec=True)
    summary["variants"].append(attempt(out, "base", cmd, changes, cenv, decode))
    cmd, changes = engine("gpu96", models)
    i = cmd.index("--mem-fraction-static")
    cmd[i + 1] = "0.93"
    changes.append({"flags": cmd[i : i + 2], "why": "the static pool raised from seed 000's 0.85: what one H100 holds"})
    summary["variants"].append(attempt(out, "dflash-6.1-mem093", cmd, changes, {**cenv, **acceptance_env(6.1)}, decode))
    return summary


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` stops us: leave through `finally`
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("shapes", "seed000", "computed", "compare", "refusal", "table"))
    ap.add_argument("out", type=Path, help="the run folder (for `shapes`: the models folder)")
    ap.add_argument("--models", type=Path, help="the folder with target/, draft/ and their real-* copies")
    ap.add_argument("--compile-cache", type=Path, help="folder for every compile cache, kept between calls")
    ap.add_argument("--levels", default="1,8,32")
    args = ap.parse_args()
    if args.part == "shapes":
        print(json.dumps({k: str(v) for k, v in make_shapes(args.out).items()}))
        return
    if args.part == "table":  # OUT: a folder of recorded parts; writes OUT/table.md
        (args.out / "table.md").write_text(table(args.out))
        print(table(args.out))
        return
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cache = args.compile_cache or out / "compile-cache"
    cenv = cache_env(cache)
    started = time.monotonic()
    if args.part == "seed000":
        summary = part_seed000(out, args.models, cenv)
    elif args.part == "computed":
        summary = part_computed(out, args.models, cache)
    elif args.part == "refusal":
        summary = part_refusal(out, args.models, cenv)
    else:
        summary = part_compare(out, args.models, cenv, [int(x) for x in args.levels.split(",")])
    summary["measured_s"] = round(time.monotonic() - started, 1)
    summary["roofline"] = roofline()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    print(table(out.parent), flush=True)


if __name__ == "__main__":
    main()
