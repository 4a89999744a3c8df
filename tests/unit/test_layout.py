"""Profiles computed from the hardware: the GPU table, the planner's layout, `profiles new`, replicas.

The layouts below are the planner's verdicts (SGLang's and vLLM's own accounting, as the plan command
prints them) for the seeds' recipes on the table's GPUs; the compose files of 8x H200 and 8x A100 80GB
are golden files (tests/fixtures/computed/, regenerate with ORNITH_UPDATE_GOLDEN=1 after a deliberate
change and read the diff).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ornith_stack.cli import main
from ornith_stack.doctor import GpuInfo, Options, diagnose
from ornith_stack.doctor.autoselect import choose_profile
from ornith_stack.errors import UserError
from ornith_stack.generate.profile_files import operator_files
from ornith_stack.gpus import gpu_table, identify, lookup
from ornith_stack.planner.layout import DEFAULT_RECIPE, compute_layout
from ornith_stack.profiles import load_all, load_profile

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "computed"
# Where golden files say the operator's profile lives (rendering does not read it).
OPERATOR_DIR = Path("/home/operator/.config/ornith-stack/profiles")

# Names as NVML (nvidia-smi) reports them, one or more per table entry.
NVML_NAMES = {
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb-pcie",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A100 80GB PCIe": "a100-80gb-pcie",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA GH200 144G HBM3e": "gh200-144g",
    "NVIDIA H800": "h800",
    "NVIDIA A800-SXM4-80GB": "a800",
    "NVIDIA A800 80GB PCIe": "a800-pcie",
    "NVIDIA A40": "a40",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA A30": "a30",
    "NVIDIA L20": "l20",
    "NVIDIA GeForce RTX 4090 D": "rtx-4090-d",
    "NVIDIA RTX PRO 5000 Blackwell": "rtx-pro-5000",
    "NVIDIA H20-3e": "h20-3e",
    "NVIDIA B300 SXM6 AC": "b300",
    "NVIDIA H20": "h20",
    "NVIDIA B200": "b200",
    "NVIDIA GB200": "gb200",
    "NVIDIA GB300": "gb300",
    "NVIDIA L40S": "l40s",
    "NVIDIA L40": "l40",
    "NVIDIA L4": "l4",
    "NVIDIA A10": "a10",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "rtx-pro-6000",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA GeForce RTX 5090": "rtx-5090",
    "NVIDIA GB10": "gb10",
}


@pytest.mark.parametrize(("nvml_name", "key"), NVML_NAMES.items())
def test_the_table_identifies_each_gpu_by_its_nvml_name(nvml_name: str, key: str) -> None:
    assert identify(nvml_name).key == key  # type: ignore[union-attr]
    assert lookup(key).key == key and lookup(nvml_name).key == key


def test_names_that_contain_one_another_are_told_apart() -> None:
    assert [identify(n).key for n in ("NVIDIA L40", "NVIDIA L40S", "NVIDIA A10", "NVIDIA A100-SXM4-80GB",
                                      "NVIDIA H20", "NVIDIA H200", "NVIDIA GB200", "NVIDIA B200")] == [  # type: ignore[union-attr]
        "l40", "l40s", "a10", "a100-80gb", "h20", "h200", "gb200", "b200"]
    assert identify("Tesla T4") is None


def test_every_table_entry_is_complete_and_plausible() -> None:
    for gpu in gpu_table().values():
        assert 16 <= gpu.memory_gib <= 300 and gpu.memory_bandwidth_gbps > 0, gpu.key
        assert gpu.compute_capability in {"8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1"}, gpu.key
    assert lookup("h100-sxm").interconnect == "nvswitch"


def test_the_table_corrections_of_issue_30() -> None:
    # Grace Hopper is one GPU per host, the 144 GB part has its own entry; NVL and PCIe boards are not
    # NVSwitch; the GB300's GPU and the B300 are the same 288 GB part.
    assert lookup("gh200").per_host == lookup("gh200-144g").per_host == 1
    assert identify("NVIDIA GH200 144G HBM3e").memory_gib > 140 > identify("NVIDIA GH200 480GB").memory_gib
    assert {identify(n).interconnect for n in ("NVIDIA H200 NVL", "NVIDIA A100 80GB PCIe",  # type: ignore[union-attr]
                                               "NVIDIA A100-PCIE-40GB")} <= {"nvlink", "pcie"}
    assert lookup("b300").memory_gib == lookup("gb300").memory_gib
    assert lookup("gb10").unified_memory and not lookup("h200").unified_memory


def test_an_unknown_gpu_is_one_error_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "new", "x", "--gpu", "Tesla K80"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "unknown GPU 'Tesla K80'" in err and "h100-sxm" in err


def test_shipped_profiles_name_their_gpus_from_the_table() -> None:
    for profile in load_all():
        if profile.hardware.gpu:
            assert set(profile.hardware.gpu.models) <= set(gpu_table()), profile.name


def test_auto_selection_matches_gpus_through_the_table(tmp_path: Path) -> None:
    # An RTX PRO 6000 Server Edition: its NVML name is the table's, and gpu96 lists that table entry (auto then
    # computes a layout that serves more on it; the saved one is picked once `up` has saved it).
    server = GpuInfo(0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 95.59, "12.0", "580.1")
    chosen, why = choose_profile("auto", [server])
    assert chosen.name == "rtx-pro-6000x1" and "profile 'gpu96' would serve" in why  # type: ignore[union-attr,operator]
    assert main(["profiles", "new", "rtx-pro-6000x1", "--gpu", "rtx-pro-6000", "--out", str(tmp_path)]) == 0
    chosen, why = choose_profile("auto", [server])
    assert chosen.name == "rtx-pro-6000x1" and "'rtx-pro-6000' in the GPU table" in why  # type: ignore[union-attr,operator]


def test_a_profile_naming_a_gpu_the_table_lacks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(load_profile.__code__.co_filename).parent / "a100x2.yaml").read_text()
    (tmp_path / "typo.yaml").write_text(text.replace("models: [a100-80gb,", "models: [a100-80,"))
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path))
    with pytest.raises(UserError, match="unknown GPU a100-80; the GPU table knows"):
        load_profile("typo")


# -- the planner's layouts ---------------------------------------------------------------------------
# Per GPU and count 1, 2, 4, 8: "R x tp T (N)" (R replicas of tp T, N running requests each), or "needs N"
# (refused; N GPUs would start), planned on the memory the engine finds (engine_memory.py) with the caps
# sized to the card, at the model's full 262,144-token window (`--context-length 262144`; the serving default
# is tested in test_operator_profiles.py). L4 x4 and A10 x4 start no request (issue 30); 8x L40S is 2 x tp 4.
FULL_WINDOW = 262_144
SEED_000_LAYOUTS = {
    "h100-sxm": ["needs 2", "1 x tp 2 (36)", "2 x tp 2 (36)", "4 x tp 2 (36)"],
    "h100-nvl": ["1 x tp 1 (1)", "1 x tp 2 (48)", "2 x tp 2 (48)", "4 x tp 2 (48)"],
    "h200": ["1 x tp 1 (32)", "2 x tp 1 (32)", "4 x tp 1 (32)", "8 x tp 1 (32)"],
    "h20": ["1 x tp 1 (2)", "1 x tp 2 (48)", "2 x tp 2 (48)", "4 x tp 2 (48)"],
    "a100-40gb": ["needs 4", "needs 4", "1 x tp 4 (23)", "1 x tp 8 (48)"],
    "a100-80gb": ["needs 2", "1 x tp 2 (36)", "2 x tp 2 (36)", "4 x tp 2 (36)"],
    "b200": ["1 x tp 1 (48)", "2 x tp 1 (48)", "4 x tp 1 (48)", "8 x tp 1 (48)"],
    "l40s": ["needs 4", "needs 4", "1 x tp 4 (37)", "2 x tp 4 (37)"],
    "l4": ["needs 8", "needs 8", "needs 8", "1 x tp 8 (2)"],
    "a10": ["needs 8", "needs 8", "needs 8", "1 x tp 8 (2)"],
    "rtx-pro-6000": ["1 x tp 1 (2)", "1 x tp 2 (48)", "2 x tp 2 (48)", "4 x tp 2 (48)"],
    "rtx-6000-ada": ["needs 2", "1 x tp 2 (1)", "1 x tp 4 (44)", "2 x tp 4 (44)"],
    "rtx-4090": ["needs 8", "needs 8", "needs 8", "1 x tp 8 (12)"],
    "rtx-5090": ["needs 4", "needs 4", "1 x tp 4 (3)", "1 x tp 8 (48)"],
}


def _verdict(recipe: str, gpu: str, count: int) -> str:
    try:
        layout = compute_layout(recipe, lookup(gpu), count, "computed", context_length=FULL_WINDOW)
    except UserError as exc:
        fix = str(exc).rpartition("--count ")[2].rstrip(")")
        return f"needs {fix}" if fix.isdigit() else "refused"
    return f"{layout.replicas} x tp {layout.tp} ({layout.caps.running})"


@pytest.mark.parametrize("gpu", SEED_000_LAYOUTS)
def test_seed_000_layouts_on_common_gpus(gpu: str) -> None:
    assert [_verdict(DEFAULT_RECIPE, gpu, n) for n in (1, 2, 4, 8)] == SEED_000_LAYOUTS[gpu]


@pytest.mark.parametrize(("recipe", "gpu", "expected"), [
    ("ornith-1.5-122b-dflash2", "gb300", ["needs 2", "1 x tp 2 (48)", "2 x tp 2 (48)"]),  # seed 004's own tp 2
    ("ornith-1.5-122b-dflash2", "h200", ["needs 4", "needs 4", "1 x tp 4 (48)", "2 x tp 4 (48)"]),
    ("ornith-1.5-122b-dflash2", "b200", ["needs 2", "1 x tp 2 (12)", "1 x tp 4 (48)", "2 x tp 4 (48)"]),
    ("ornith-1.0-35b-bf16", "gb10", ["1 x tp 1 (1)"]),  # seed 003's own machine
    ("ornith-1.0-35b-bf16", "h100-sxm", ["needs 2", "1 x tp 2 (14)", "2 x tp 2 (14)", "4 x tp 2 (14)"]),
    ("ornith-1.0-35b-bf16", "rtx-4090", ["needs 8", "needs 8", "needs 8", "1 x tp 8 (1)"]),
])
def test_other_recipes(recipe: str, gpu: str, expected: list[str]) -> None:
    assert [_verdict(recipe, gpu, n) for n in (1, 2, 4, 8)[: len(expected)]] == expected


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-40gb", "l40s", "h200"])
def test_the_chosen_layout_serves_the_most_requests_and_starts(gpu: str) -> None:
    layout = compute_layout(DEFAULT_RECIPE, lookup(gpu), 8, "computed")
    assert not layout.plan.problems and layout.tp * layout.replicas <= 8
    tried = [compute_layout(DEFAULT_RECIPE, lookup(gpu), 8, "computed", "latency")]
    assert layout.running >= max(t.running for t in tried)
    # Every other tp that starts serves no more requests over the host.
    for line in layout.considered:
        if "running =" in line:
            assert int(line.rpartition("= ")[2]) <= layout.running, line


def test_one_h100_is_refused_with_the_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["profiles", "new", "h100", "--gpu", "NVIDIA H100 80GB HBM3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert "one NVIDIA H100 80GB (SXM)" in err and "two of them, tp 2, would (36 running requests per replica; " \
        "--count 2)" in err
    assert list(tmp_path.iterdir()) == [] and not (Path(os.environ["ORNITH_PROFILE_DIR"]) / "h100.yaml").exists()


def test_more_gpus_than_one_host_holds_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "new", "spark2", "--gpu", "gb10", "--count", "2", "--model", "ornith-1.0-35b-bf16"]) == 2
    assert "one host holds at most 1x NVIDIA GB10" in capsys.readouterr().err


# -- profiles new ------------------------------------------------------------------------------------


def test_profiles_new_writes_a_profile_that_loads_and_files_that_name_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert main(["profiles", "new", "h100x4", "--gpu", "h100-sxm", "--count", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "h100x4: 2 replica(s) x tp 2 on 4x NVIDIA H100 80GB (SXM)" in printed
    profile_file = Path(os.environ["ORNITH_PROFILE_DIR"]) / "h100x4.yaml"
    profile = load_profile("h100x4")  # found in the operator's folder
    assert (profile.serve.replicas, profile.serve.args["tp-size"], profile.gpu_count) == (2, 2, 4)
    assert profile.engine.image == load_profile("a100x2").engine.image  # the pin comes from images.yaml
    text = profile_file.read_text()
    # The draft's shape is inferred: the verdict is unknown, and the file says so.
    assert "image:" not in text and "Planner (sglang 0.5.17): unknown; per replica" in text
    assert "SGLang will log max_total_num_tokens=" in text and "# Unknown: the draft shape" in text
    for rel in ("compose/h100x4.yml", "helm/ornith/values-h100x4.yaml", "ansible/profiles/h100x4.yml"):
        text = (out / rel).read_text()
        assert f"from {profile_file} and" in text.splitlines()[0] and "ornith-stack profiles new h100x4" in text
    assert main(["launch-args", "h100x4"]) == 0 and "--tp-size 2" in capsys.readouterr().out
    assert main(["profiles", "new", "h100x4", "--gpu", "h100-sxm", "--count", "4", "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["profiles", "new", "gpu96", "--gpu", "h200"]) == 2
    assert "'gpu96' is a shipped profile" in capsys.readouterr().err


def test_doctor_auto_computes_the_layout_for_the_host() -> None:
    """2x H100: no saved profile matches; auto computes 1 x tp 2 and says how `profiles new` writes it."""
    h100s = [GpuInfo(i, "NVIDIA H100 80GB HBM3", 79.65, "9.0", "580.65.06") for i in range(2)]
    chosen, why = choose_profile("auto", h100s)
    assert chosen is not None and chosen.name == "h100-sxmx2" and chosen.gpu_count == 2
    assert "auto computed 'h100-sxmx2' for 2x NVIDIA H100 80GB HBM3: 1 replica(s) x tp 2" in str(why)
    assert "`ornith-stack profiles new h100-sxmx2 --gpu h100-sxm --count 2` writes it" in str(why)


def test_doctor_auto_offers_nothing_for_a_gpu_the_table_lacks() -> None:
    with pytest.raises(UserError, match="no profile matches 2x Tesla T4"):
        choose_profile("auto", [GpuInfo(i, "Tesla T4", 15.0, "7.5", "580.65.06") for i in range(2)])


def test_each_replica_container_checks_its_own_gpus(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["profiles", "new", "h200x8", "--gpu", "h200", "--count", "8", "--out", str(tmp_path)]) == 0
    one = [GpuInfo(0, "NVIDIA H200", 140.4, "9.0", "580.159.04")]  # what engine-3's container sees
    report = diagnose(Options(profile="h200x8", replica_only=True), gpus=one)
    assert not [f for f in report.findings if f.topic == "gpu count"], report.findings
    assert report.plan is not None and not report.plan.problems
    # The same GPU seen from the host (no ORNITH_REPLICA): eight replicas do not fit on one GPU.
    host = diagnose(Options(profile="h200x8"), gpus=one)
    assert not host.ready and [f.topic for f in host.problems] == ["gpu count"]


# -- replicas in compose -----------------------------------------------------------------------------


def _computed_compose(gpu: str, count: int) -> str:
    name = f"{gpu}x{count}"
    layout = compute_layout(DEFAULT_RECIPE, lookup(gpu), count, name)
    command = f"ornith-stack profiles new {name} --gpu {gpu} --count {count} --model {DEFAULT_RECIPE}"
    compose = next(f for f in operator_files(layout.profile, OPERATOR_DIR / f"{name}.yaml", command)
                   if f.path.startswith("compose/"))
    return compose.build()


@pytest.mark.parametrize(("gpu", "count"), [("h200", 8), ("a100-80gb", 8)])
def test_computed_compose_matches_its_golden_file(gpu: str, count: int) -> None:
    golden = GOLDEN / f"compose-{gpu}x{count}.yml"
    text = _computed_compose(gpu, count)
    if os.environ.get("ORNITH_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_replicas_are_pinned_to_their_own_gpus_behind_the_gateway() -> None:
    services = yaml.safe_load(_computed_compose("a100-80gb", 8))["services"]
    engines = {name: s for name, s in services.items() if name.startswith("engine")}
    assert sorted(engines) == ["engine-0", "engine-1", "engine-2", "engine-3"]
    devices = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in engines.values()]
    assert devices == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert all("ports" not in s for s in engines.values())  # the gateway is the one endpoint
    gateway = services["gateway"]
    command = gateway["command"]
    workers = command[command.index("--worker-urls") + 1: command.index("--policy")]
    assert workers == [f"http://engine-{i}:30000" for i in range(4)]
    assert command[command.index("--policy") + 1] == "cache_aware"
    # Balanced once a replica has its running-request limit (sized to the A100 80GB: 36) more in flight.
    assert command[command.index("--balance-abs-threshold") + 1] == "36"
    assert gateway["ports"] == ["${ORNITH_BIND:-127.0.0.1}:${ORNITH_ENGINE_PORT:-30000}:30000"]
    assert "/readiness" in " ".join(gateway["healthcheck"]["test"])
    exporter = services["exporter"]["command"]
    assert [exporter[i + 1] for i, w in enumerate(exporter) if w == "--target"] == workers


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (v1) is not installed")
@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("compose-*.yml")), ids=lambda p: p.stem)
def test_docker_compose_accepts_the_computed_files(golden: Path, tmp_path: Path) -> None:
    (tmp_path / "compose").mkdir()
    shutil.copy(golden, tmp_path / "compose" / golden.name)
    result = subprocess.run(["docker-compose", "-f", f"compose/{golden.name}", "config", "-q"], cwd=tmp_path,
                            check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
