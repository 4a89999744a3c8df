"""The doctor on synthetic checkpoints (safetensors headers + index written here in pure Python) and
on GPUs described to it, since the build machine has none.

A safetensors file is an 8-byte little-endian header length, a JSON header, then the raw data. The
doctor reads only headers (and one embedding row), so a header may declare tensors far larger than
the bytes written: that is how a "65 GiB" checkpoint fits in a test.
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ornith_stack.cli import main
from ornith_stack.cuda_requirement import CUDA_MINIMUM_DRIVER
from ornith_stack.doctor import Finding, GpuInfo, Options, Report, diagnose
from ornith_stack.doctor import gpu as gpu_probe
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile, profile_names

# As the probe reports them: H200 measured on this project's GPU machine (150,754,820,096 bytes);
# GB10's memory is the host's MemTotal (127,600,748 kB on a DGX Spark), NVML has none for it.
H200 = GpuInfo(0, "NVIDIA H200", 140.4, "9.0", "580.159.04")
A100 = GpuInfo(0, "NVIDIA A100-SXM4-80GB", 80.0, "8.0", "580.65.06")
GB10 = GpuInfo(0, "NVIDIA GB10", 121.69, "12.1", "580.173.02", memory_source=gpu_probe.HOST_MEMORY)


# -- a tiny checkpoint writer ------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes | int]]) -> None:
    """name -> (dtype, shape, data or a byte count of zeros, left sparse on disk)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        size = data if isinstance(data, int) else len(data)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for _, _, data in tensors.values():
            if isinstance(data, int):
                fh.seek(data, 1)  # a hole: the file gets its full length without the bytes written
            else:
                fh.write(data)
        fh.truncate()


def text_config(mtp: int = 1) -> dict[str, Any]:
    return {"hidden_size": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2,
            "num_hidden_layers": 4, "vocab_size": 16, "max_position_embeddings": 64,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 1,
            "linear_num_value_heads": 1, "linear_key_head_dim": 2, "linear_value_head_dim": 2,
            "mtp_num_hidden_layers": mtp, "mamba_ssm_dtype": "float32"}


def make_checkpoint(root: Path, *, mtp: bool = False, vision_depth: int | None = None,
                    visual_tensors: int | None = None, mask_row_zero: bool = False, mask_id: int = 5,
                    extra_bytes: int = 0) -> Path:
    """Two shards + index. Embedding 16 x 4 BF16 with row `mask_id` zeroed or not."""
    root.mkdir(parents=True)
    config: dict[str, Any] = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "dtype": "bfloat16",
                              "text_config": text_config(), "ornith_mask_token_id": mask_id}
    if vision_depth is not None:
        config["vision_config"] = {"depth": vision_depth, "hidden_size": 4, "intermediate_size": 8}
    (root / "config.json").write_text(json.dumps(config))
    rows = [b"\x00\x3f" * 4] * 16  # bf16 0.5 everywhere
    if mask_row_zero:
        rows[mask_id] = b"\x00\x80" * 4  # -0.0: still zero
    first = {"model.language_model.embed_tokens.weight": ("BF16", [16, 4], b"".join(rows)),
             "lm_head.weight": ("BF16", [16, 4], b"\x00" * 128)}
    if extra_bytes:
        first["model.language_model.layers.0.mlp.experts.gate_up_proj"] = ("BF16", [extra_bytes // 2], extra_bytes)
    second: dict[str, tuple[str, list[int], bytes | int]] = {}
    if mtp:
        second["mtp.fc.weight"] = ("BF16", [4, 8], b"\x00" * 64)
    count = visual_tensors if visual_tensors is not None else (12 * vision_depth + 9 if vision_depth else 0)
    for i in range(count):
        second[f"model.visual.t{i}.weight"] = ("BF16", [2], b"\x00" * 4)
    second.setdefault("model.language_model.norm.weight", ("BF16", [4], b"\x00" * 8))
    write_safetensors(root / "model-00001-of-00002.safetensors", first)
    write_safetensors(root / "model-00002-of-00002.safetensors", second)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map |= {n: "model-00002-of-00002.safetensors" for n in second}
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1},
                                                                    "weight_map": weight_map}))
    return root


def findings(report: Report, topic: str) -> list[Finding]:
    return [f for f in report.findings if f.topic == topic]


# -- GPUs and profiles -------------------------------------------------------------------------------


def test_no_gpu_is_one_problem_line_and_exit_1(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    pynvml = pytest.importorskip("pynvml")

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    assert main(["doctor", "--profile", "spark"]) == 1
    text = capsys.readouterr().out
    assert "FAIL  gpu: no GPU detected (NVML library (libnvidia-ml.so.1) not found" in text
    assert "Traceback" not in text
    assert main(["doctor", "--profile", "spark", "--allow-no-gpu"]) == 0
    assert main(["doctor", "--profile", "spark", "--warn-only"]) == 0


@pytest.mark.parametrize(("gpus", "expected"), [
    ([H200], "h200x1"),
    ([A100, GpuInfo(1, A100.name, 80.0, "8.0", A100.driver_version)], "a100-80gbx2"),
    ([GB10], "spark"),
    ([], "cpu-demo"),
])
def test_auto_picks_the_profile_that_fits_and_says_why(gpus: list[GpuInfo], expected: str) -> None:
    report = diagnose(Options(profile="auto"), gpus=gpus, gpu_error=None if gpus else "none")
    assert report.profile == expected
    assert report.profile_reason and expected in report.profile_reason
    assert report.ready, [f.line() for f in report.problems]


def test_auto_with_an_unknown_gpu_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no profile matches 1x NVIDIA T4"):
        diagnose(Options(profile="auto"), gpus=[GpuInfo(0, "NVIDIA T4", 15.0, "7.5", "580.1")])


def test_gpu_mismatches_are_problems() -> None:
    old = GpuInfo(0, "NVIDIA A100-SXM4-80GB", 80.0, "8.0", "545.23.08")
    report = diagnose(Options(profile="a100x2"), gpus=[old])
    lines = [f.line() for f in report.problems]
    assert any("gpu count: 1 GPU(s) on this host, profile 'a100x2' runs tp 2" in line for line in lines)
    assert any("driver: 545.23.08 is below the floor 575.51.03" in line for line in lines)


def test_one_80_gib_card_for_gpu96_fails_with_the_plan_component() -> None:
    report = diagnose(Options(profile="gpu96"), gpus=[A100])
    lines = [f.line() for f in report.problems]
    assert any("gpu memory: #0 has 80 GiB" in line for line in lines)
    # The planner's verdict on the real card (seed 000: one 80 GB card is not enough): the weights and what
    # SGLang's load adds leave nothing of the static pool, so SGLang stops before sizing one.
    assert any("plan (weights)" in line for line in lines)
    assert any("smallest change that fits: --tp 2" in f.message for f in findings(report, "plan"))


# -- checkpoints --------------------------------------------------------------------------------------


def test_mtp_declared_but_absent_is_reported(tmp_path: Path) -> None:
    # Seed 003: "the config advertises mtp_num_hidden_layers: 1 ... not one of them matches 'mtp'".
    report = diagnose(Options(profile="cpu-demo", weights=make_checkpoint(tmp_path / "a")), gpus=[])
    (mtp,) = findings(report, "mtp")
    assert mtp.level == "warn" and "no free speculative draft" in mtp.message
    report = diagnose(Options(profile="cpu-demo", weights=make_checkpoint(tmp_path / "b", mtp=True)), gpus=[])
    assert findings(report, "mtp")[0].level == "ok"


def test_vision_tensors_against_the_vision_config(tmp_path: Path) -> None:
    complete = diagnose(Options(profile="cpu-demo", weights=make_checkpoint(tmp_path / "a", vision_depth=2)),
                        gpus=[])
    assert findings(complete, "vision")[0].level == "ok" and "33 visual.*" in findings(complete, "vision")[0].message
    missing = diagnose(Options(profile="cpu-demo",
                               weights=make_checkpoint(tmp_path / "b", vision_depth=2, visual_tensors=0)), gpus=[])
    (line,) = findings(missing, "vision")
    assert line.level == "problem" and "--language-model-only" in line.message
    partial = diagnose(Options(profile="cpu-demo",
                               weights=make_checkpoint(tmp_path / "c", vision_depth=2, visual_tensors=20)), gpus=[])
    assert "20 of 33" in findings(partial, "vision")[0].message


def test_zeroed_mask_row(tmp_path: Path) -> None:
    # Seed 004: GGUF builds store the mask token's row as zeros; mask_embedding.safetensors holds it.
    ok = diagnose(Options(profile="cpu-demo", weights=make_checkpoint(tmp_path / "a")), gpus=[])
    assert findings(ok, "mask token")[0].level == "ok"
    zeroed = make_checkpoint(tmp_path / "b", mask_row_zero=True)
    bad = diagnose(Options(profile="cpu-demo", weights=zeroed), gpus=[])
    (line,) = findings(bad, "mask token")
    assert line.level == "problem" and "row 5 is all zeros" in line.message and not bad.ready
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"dflash_config": {"mask_token_id": 5}}))
    write_safetensors(draft / "mask_embedding.safetensors", {"mask_embedding": ("BF16", [4], b"\x00" * 8)})
    rescued = diagnose(Options(profile="cpu-demo", weights=zeroed, draft_weights=draft), gpus=[])
    assert findings(rescued, "mask token")[0].level == "warn" and rescued.ready


def test_checkpoint_bytes_feed_the_plan(tmp_path: Path) -> None:
    # A checkpoint declaring 90 GiB of weights cannot fit gpu96's 96 GiB card whatever the shape says.
    big = make_checkpoint(tmp_path / "big", extra_bytes=90 << 30)
    report = diagnose(Options(profile="gpu96", weights=big), gpus=[GpuInfo(0, "NVIDIA RTX PRO 6000", 96.0, "12.0",
                                                                           "580.1")])
    assert report.plan is not None and report.plan.weights_bytes > 90 << 30
    assert any(f.topic.startswith("plan (") for f in report.problems)
    assert any("checkpoint size" == f.topic for f in report.findings)


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda: [GB10])
    assert main(["doctor", "--profile", "spark", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ready"] is True and data["problems"] == []
    assert data["plan"]["kv_cache_tokens"] == 412980  # seed 003, planned on the detected GB10


# -- driver floors ------------------------------------------------------------------------------------


def _gpus_for(profile: str, driver: str) -> list[GpuInfo]:
    prof = load_profile(profile)
    assert prof.hardware.gpu is not None
    base = {"spark": GB10, "a100x2": A100}.get(profile, H200)
    return [replace(base, index=i, driver_version=driver) for i in range(prof.hardware.gpu.count)]


def _driver_finding(profile: str, driver: str) -> Finding:
    (finding,) = findings(diagnose(Options(profile=profile), gpus=_gpus_for(profile, driver)), "driver")
    return finding


GPU_PROFILES = [n for n in profile_names() if load_profile(n).hardware.gpu is not None]


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_driver_just_above_the_image_floor_passes_just_below_is_refused(profile: str) -> None:
    requirement = load_profile(profile).engine.cuda_requirement
    assert requirement is not None
    floor = requirement.floor
    major, minor, patch = (int(p) for p in floor.split("."))
    above = _driver_finding(profile, f"{major}.{minor}.{patch + 1:02d}")
    assert above.level == "ok" and f"floor {floor}" in above.message and f"cuda>={requirement.cuda_text}" in above.message
    below = _driver_finding(profile, f"{major}.{minor}.{patch - 1:02d}")
    assert below.level == "problem" and f"below the floor {floor}" in below.message
    assert load_profile(profile).engine.image in below.message


@pytest.mark.parametrize(("profile", "floor"), [("spark", "580"), ("gb300x2", "580"), ("gpu96", "575"),
                                                ("a100x2", "575")])
def test_the_floor_follows_the_image_cuda_version(profile: str, floor: str) -> None:
    # cu130 images (vLLM 0.24.0, SGLang 0.5.21-cu130) need the 580 branch; SGLang's cu129 image the 575 one.
    requirement = load_profile(profile).engine.cuda_requirement
    assert requirement is not None and requirement.floor.split(".")[0] == floor
    assert requirement.floor == CUDA_MINIMUM_DRIVER[requirement.cuda]
    refused = _driver_finding(profile, f"{int(floor) - 1}.99")
    assert refused.level == "problem" and f"needs driver >= {floor}." in refused.message


@pytest.mark.parametrize(("profile", "driver", "branch"), [("a100x2", "570.195.03", 570),
                                                           ("gpu96", "535.274.02", 535),
                                                           ("gb300x2", "575.57.08", 575)])
def test_a_datacenter_branch_the_image_declares_passes(profile: str, driver: str, branch: int) -> None:
    # NVIDIA_REQUIRE_CUDA lists brand=tesla branches below the floor: CUDA forward compatibility.
    finding = _driver_finding(profile, driver)
    assert finding.level == "ok" and f"brand=tesla,driver>={branch},driver<{branch + 1}" in finding.message


def test_the_ansible_variables_carry_the_floor(repo: Path) -> None:
    text = (repo / "ansible" / "profiles" / "spark.yml").read_text()
    assert 'ornith_min_driver: "580.65.06"' in text
    assert "ornith_driver_datacenter_branches: [535, 550, 565, 570, 575]" in text


# -- bad checkpoints: one error line, exit 2 ----------------------------------------------------------


def run_doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["doctor", "--profile", "cpu-demo", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return rc, captured.err


def _truncate_first_shard(p: Path) -> None:
    shard = p / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-40])


def _index_escapes(p: Path) -> None:
    index = json.loads((p / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../outside.safetensors"
    (p / "model.safetensors.index.json").write_text(json.dumps(index))
    write_safetensors(p.parent / "outside.safetensors", {name: ("BF16", [16, 4], b"\x00" * 128)})


def _index_absolute(p: Path) -> None:
    index = json.loads((p / "model.safetensors.index.json").read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = str(p / "model-00001-of-00002.safetensors")
    (p / "model.safetensors.index.json").write_text(json.dumps(index))


def _header_offsets_lie(p: Path) -> None:
    write_safetensors(p / "model-00002-of-00002.safetensors",
                      {"model.language_model.norm.weight": ("BF16", [400], b"\x00" * 8)})


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda p: (p / "model.safetensors.index.json").write_text('{"metadata": {}}'),
     "model.safetensors.index.json: key 'weight_map' is missing or empty"),
    (lambda p: (p / "model.safetensors.index.json").write_text('{"weight_map": {"a": '),
     "model.safetensors.index.json: not valid JSON"),
    (lambda p: (p / "config.json").write_text("{not json"), "config.json: not valid JSON"),
    (lambda p: (p / "config.json").unlink(), "config.json is missing"),
    (lambda p: (p / "model-00002-of-00002.safetensors").unlink(),
     "weight_map names 'model-00002-of-00002.safetensors', which is missing"),
    (lambda p: (p / "model-00001-of-00002.safetensors").write_bytes(b"\x05"),
     "model-00001-of-00002.safetensors: not a safetensors file"),
    (lambda p: (p / "model-00001-of-00002.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope"),
     "model-00001-of-00002.safetensors: safetensors header is not valid JSON"),
    (_header_offsets_lie, "tensor 'model.language_model.norm.weight' is BF16 [400] (800 bytes) but its "
                          "data_offsets span 8 bytes"),
    (_truncate_first_shard, "model-00001-of-00002.safetensors: truncated: its header declares 256 bytes of "
                            "tensor data, the file holds 216"),
    (_index_escapes, "weight_map names '../outside.safetensors', a file outside"),
    (_index_absolute, "a file outside"),
])
def test_broken_checkpoint_is_one_error_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             breakage: Any, message: str) -> None:
    path = make_checkpoint(tmp_path / "ckpt")
    breakage(path)
    rc, err = run_doctor(capsys, "--weights", str(path))
    assert rc == 2 and err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_truncated_shard_is_never_read_as_a_zero_mask_row(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # The embedding (row 5 intact) is the first tensor; cut the shard inside it.
    path = make_checkpoint(tmp_path / "ckpt")
    shard = path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-200])
    rc, err = run_doctor(capsys, "--weights", str(path), "--json")
    assert rc == 2 and "truncated" in err and "all zeros" not in err


def test_negative_mask_token_id_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_checkpoint(tmp_path / "ckpt")
    rc, err = run_doctor(capsys, "--weights", str(path), "--mask-token-id", "-1")
    assert rc == 2 and err.strip() == "error: --mask-token-id -1: a token id is 0 or more"
