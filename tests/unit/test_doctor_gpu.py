"""The GPU probe against NVML as real hardware answers it, asked through pynvml's own functions.

The build machine has no GPU, so each test replaces the pynvml functions the probe calls. What they
return or raise is what real hardware returns: pynvml's real structures and its real exception
classes (`pynvml.NVMLError(code)` builds the subclass NVML raises for that return code), with values
recorded on real machines:
- H200 (HGX board, measured on this project's GPU machine): name "NVIDIA H200", compute capability
  9.0, memory total 150,754,820,096 bytes, driver 580.159.04, NVLinks 0-17 end at NVSwitches (remote
  device type 2), link 18 answers INVALID_ARGUMENT; idle, nvidia-smi shows 143,156 MiB of 143,771 MiB
  free (2026-12-01) and SGLang 0.5.17 logs "avail mem=139.09 GB" before loading its weights;
- DGX Spark (kubernetes-sigs/dra-driver-nvidia-gpu#1073, XuehaiPan/nvitop#208): name "NVIDIA GB10",
  compute capability 12.1, driver 580.173.02, the memory query answers NOT_SUPPORTED and
  /proc/meminfo says "MemTotal: 127600748 kB"; the doctor budgets MemAvailable + SwapFree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from ornith_stack.cli import main  # noqa: E402
from ornith_stack.doctor import NoGpu, Options, diagnose, probe_gpus  # noqa: E402
from ornith_stack.doctor import gpu as gpu_probe  # noqa: E402

SPARK_MEMINFO = "MemTotal:       127600748 kB\nMemFree:        118000000 kB\nMemAvailable:   118566368 kB\n"
H200_MEMORY_BYTES = 150_754_820_096


def nvml_error(code: int) -> Exception:
    """The exception pynvml raises for an NVML return code (an instance of its per-code subclass)."""
    return pynvml.NVMLError(code)


@dataclass
class Device:
    name: str
    capability: tuple[int, int]
    memory: int | None = None  # bytes; None: the memory query answers `memory_error`
    memory_error: int = pynvml.NVML_ERROR_NOT_SUPPORTED
    free: int | None = None  # bytes free; None: all of it
    links: list[int] = field(default_factory=list)  # remote device type per NVLink
    links_error: int = pynvml.NVML_ERROR_NOT_SUPPORTED  # answer for links past the list
    fabric: tuple[int, int] | None = None  # (state, status); None: the query answers NOT_SUPPORTED
    # nvmlDeviceGetBrand: datacenter GPUs from the T4 on report NVIDIA (`nvidia-smi -q` "Product Brand : NVIDIA"
    # on T4, H100 and GH200, tests/fixtures/nvidia/README.md).
    brand: int = pynvml.NVML_BRAND_NVIDIA


def install_nvml(monkeypatch: pytest.MonkeyPatch, devices: list[Device], driver: str) -> None:
    """Make pynvml answer for `devices` the way the driver does."""

    def handle(index: int) -> Device:
        return devices[index]

    def memory(dev: Device) -> Any:
        if dev.memory is None:
            raise nvml_error(dev.memory_error)
        free = dev.memory if dev.free is None else dev.free
        return pynvml.c_nvmlMemory_t(total=dev.memory, free=free, used=dev.memory - free)

    def remote_type(dev: Device, link: int) -> int:
        if link < len(dev.links):
            return dev.links[link]
        raise nvml_error(dev.links_error)

    def fabric(dev: Device, ref: Any) -> int:
        if dev.fabric is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ref._obj.state, ref._obj.status = dev.fabric
        return pynvml.NVML_SUCCESS

    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: driver,
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda dev: dev.name,
        "nvmlDeviceGetCudaComputeCapability": lambda dev: dev.capability,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetNvLinkRemoteDeviceType": remote_type,
        "nvmlDeviceGetGpuFabricInfo": fabric,
        "nvmlDeviceGetBrand": lambda dev: dev.brand,
    }
    for name, function in calls.items():
        monkeypatch.setattr(pynvml, name, function)


def hgx_h200(fabric: tuple[int, int] | None) -> Device:
    return Device("NVIDIA H200", (9, 0), H200_MEMORY_BYTES, links=[pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH] * 18,
                  links_error=pynvml.NVML_ERROR_INVALID_ARGUMENT, fabric=fabric)


@pytest.fixture
def spark_meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(SPARK_MEMINFO)
    monkeypatch.setattr(gpu_probe, "MEMINFO", path)
    return path


def test_gb10_memory_not_supported_takes_the_host_memory_and_passes(
        monkeypatch: pytest.MonkeyPatch, spark_meminfo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_nvml(monkeypatch, [Device("NVIDIA GB10", (12, 1))], "580.173.02")
    (gb10,) = probe_gpus()
    assert gb10.memory_gib == round(118566368 * 1024 / (1 << 30), 2) and "unified memory" in gb10.memory_source
    assert main(["doctor", "--profile", "auto"]) == 0
    out = capsys.readouterr().out
    assert "auto picked 'spark'" in out
    assert "from host MemAvailable + SwapFree (unified memory" in out and "ready: profile spark" in out


def test_a_failed_query_is_reported_not_taken_for_no_gpu(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # A discrete GPU whose memory query is refused (a container without the right capabilities).
    h200 = Device("NVIDIA H200", (9, 0), None, memory_error=pynvml.NVML_ERROR_NO_PERMISSION)
    install_nvml(monkeypatch, [h200], "580.159.04")
    (gpu,) = probe_gpus()
    assert gpu.name == "NVIDIA H200" and gpu.memory_gib is None
    assert gpu.unanswered == ("memory: Insufficient Permissions",)
    assert main(["doctor", "--profile", "gpu96"]) == 1
    out = capsys.readouterr().out
    assert "#0 did not answer memory: Insufficient Permissions" in out
    assert "FAIL  gpu memory: #0: NVML could not read its memory" in out and "no GPU detected" not in out


@pytest.mark.parametrize(("code", "says"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1) not found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to open the GPU device files"),
    (pynvml.NVML_ERROR_UNINITIALIZED, "NVML could not start (Uninitialized)"),
])
def test_nvml_that_cannot_start_means_no_gpu_with_the_reason(monkeypatch: pytest.MonkeyPatch, code: int,
                                                             says: str) -> None:
    def init() -> None:
        raise nvml_error(code)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    with pytest.raises(NoGpu, match=says.replace("(", r"\(").replace(")", r"\)")):
        probe_gpus()


def test_hgx_without_fabric_manager_fails_with_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    not_started = (pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, pynvml.NVML_SUCCESS)
    install_nvml(monkeypatch, [hgx_h200(not_started) for _ in range(8)], "580.159.04")
    gpus = probe_gpus()
    assert all(g.nvswitch and g.fabric_state == "not started" for g in gpus)
    assert main(["doctor", "--profile", "gpu96"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  fabric: NVSwitch fabric state not started: CUDA fails with error 802" in out
    assert "install and start nvidia-fabricmanager of driver branch 580" in out


def test_hgx_with_fabric_registered_is_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    done = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
    install_nvml(monkeypatch, [hgx_h200(done)], "580.159.04")
    report = diagnose(Options(profile="gpu96"))
    (fabric,) = [f for f in report.findings if f.topic == "fabric"]
    assert fabric.level == "ok" and "state completed" in fabric.message and report.ready


def test_fabric_registration_that_failed_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_NOT_READY)
    install_nvml(monkeypatch, [hgx_h200(failed)], "580.159.04")
    report = diagnose(Options(profile="gpu96"))
    assert any(f.topic == "fabric" and "completed with error" in f.message for f in report.problems)


@pytest.mark.parametrize(("cuinit", "level", "says"), [
    (802, "problem", "CUDA answers error 802 (system not ready)"),
    (0, "ok", "NVML shows no fabric state and CUDA starts"),
    (None, "warn", "libcuda cannot be loaded here"),
])
def test_nvswitch_without_fabric_state_asks_cuda(monkeypatch: pytest.MonkeyPatch, cuinit: int | None,
                                                 level: str, says: str) -> None:
    # As measured on the H200 machine: links to NVSwitches, fabric state NOT_SUPPORTED (a VM whose host
    # runs the fabric manager), cuInit 0. cuInit's answer decides: 802 = no fabric manager.
    install_nvml(monkeypatch, [hgx_h200((pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_SUCCESS))],
                 "580.159.04")
    monkeypatch.setattr(gpu_probe, "cuda_init_error", lambda: cuinit)
    (gpu,) = probe_gpus()
    assert gpu.nvswitch and gpu.fabric_state is None
    (fabric,) = [f for f in diagnose(Options(profile="gpu96")).findings if f.topic == "fabric"]
    assert fabric.level == level and says in fabric.message
    if level == "problem":
        assert "install and start nvidia-fabricmanager of driver branch 580" in fabric.message


def test_real_nvml_probe_never_raises_anything_but_nogpu() -> None:
    try:
        gpus = probe_gpus()
    except NoGpu as exc:
        assert str(exc)
    else:
        assert gpus and all(g.memory_gib is None or g.memory_gib > 0 for g in gpus)


# /proc/meminfo of a DGX Spark serving a model (spark-2 of a three-Spark DeepSeek V4 report on GitHub): 121 GiB
# in MemTotal, but 4.4 GiB available and 11.8 GiB of swap free.
SPARK_BUSY_MEMINFO = ("MemTotal:       127600748 kB\nMemAvailable:    4617684 kB\nSwapTotal:      16777212 kB\n"
                      "SwapFree:       12405576 kB\n")


def test_host_memory_is_what_the_host_can_still_give(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"
    path.write_text(SPARK_MEMINFO)
    assert gpu_probe.host_memory_gib(path) == round(118566368 * 1024 / (1 << 30), 2)  # no swap line
    path.write_text(SPARK_BUSY_MEMINFO)
    assert gpu_probe.host_memory_gib(path) == round((4617684 + 12405576) * 1024 / (1 << 30), 2)
    assert gpu_probe.host_memory_gib(tmp_path / "absent") is None


def test_the_plan_uses_the_free_memory_nvml_reports_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang sizes its pools from the memory free before it loads, not the total: on an H200 the total
    reads about 1.3 GiB high. The doctor plans on NVML's free memory at check time and names it."""
    free = int(139.09 * (1 << 30))  # what SGLang found free on the recorded H200 (tp 1)
    install_nvml(monkeypatch, [Device("NVIDIA H200", (9, 0), H200_MEMORY_BYTES, free=free)], "580.159.04")
    (gpu,) = probe_gpus()
    assert (gpu.memory_gib, gpu.free_gib) == (140.4, 139.09)
    report = diagnose(Options(profile="gpu96"))
    # The verdict is unknown (the 35B draft's shape is inferred): the plan line is a warning.
    (plan,) = [f for f in report.findings if f.topic == "plan"]
    assert "planned on the 139.09 GiB NVML reports free now" in plan.message
    # The engine then takes its CUDA context (0.61) and torch.distributed (0.10); the caps' 0.5 GiB slack is
    # not taken off again (issue 41): the doctor plans on what it observes.
    assert report.plan is not None and report.plan.engine_details["memory_before_load_gib"] == pytest.approx(138.38)
    assert any("pools sized from 138.38 GiB per GPU: NVML's free 139.09 GiB - CUDA context 0.61" in n
               and "no slack taken off" in n for n in report.plan.notes)
    # Planning on the total instead overstates the state slots SGLang will allocate.
    install_nvml(monkeypatch, [Device("NVIDIA H200", (9, 0), H200_MEMORY_BYTES)], "580.159.04")
    on_total = diagnose(Options(profile="gpu96")).plan
    assert on_total is not None
    slots = on_total.engine_details["max_mamba_cache_size"], report.plan.engine_details["max_mamba_cache_size"]
    assert slots[0] > slots[1] * 1.005
def test_a_busy_spark_is_refused_with_the_memory_it_has_left(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "meminfo"
    path.write_text(SPARK_BUSY_MEMINFO)
    monkeypatch.setattr(gpu_probe, "MEMINFO", path)
    install_nvml(monkeypatch, [Device("NVIDIA GB10", (12, 1))], "580.173.02")
    assert main(["doctor", "--profile", "spark"]) == 1
    out = capsys.readouterr().out
    assert "16.23 GiB from host MemAvailable + SwapFree (unified memory" in out
    assert "FAIL  gpu memory: #0 has 16.23 GiB, profile 'spark' expects 114 GiB" in out


def test_every_brand_the_images_declare_is_a_brand_nvml_reports() -> None:
    """The brand= words of the real NVIDIA_REQUIRE_CUDA strings (images.yaml) are names of pynvml's brands."""
    from ornith_stack.cuda_requirement import parse_requirement
    from ornith_stack.profiles import images

    brands = {gpu_probe.brand_name(pynvml, getattr(pynvml, name)) for name in dir(pynvml)
              if name.startswith("NVML_BRAND_") and name != "NVML_BRAND_COUNT"}
    for declaration in images()["cuda_requirements"].values():
        declared = {branch.brand for branch in parse_requirement(declaration).branches}
        assert declared and declared <= brands, declared - brands


@pytest.mark.parametrize(("brand", "driver", "level", "says"), [
    # H100 on 560.35.03 (tests/fixtures/nvidia/nvidia-smi-q-h100-560.txt): the cu129 image's brand=nvidia clause.
    (pynvml.NVML_BRAND_NVIDIA, "560.35.03", "ok", "brand=nvidia,driver>=560,driver<561: datacenter forward"),
    # A GeForce RTX 3050 on 535.183.01 (nvidia-smi-q-geforce-rtx3050-535.txt): no forward compatibility.
    (pynvml.NVML_BRAND_GEFORCE, "535.183.01", "problem", "on a geforce GPU: forward compatibility"),
    (pynvml.NVML_BRAND_NVIDIA_RTX, "570.124.06", "problem", "on a nvidiartx GPU"),
    (pynvml.NVML_BRAND_GEFORCE, "575.51.03", "ok", "cuda>=12.9: driver >= 575.51.03"),  # the floor: any brand
])
def test_the_driver_verdict_follows_the_gpu_brand(monkeypatch: pytest.MonkeyPatch, brand: int, driver: str,
                                                  level: str, says: str) -> None:
    install_nvml(monkeypatch, [replace(hgx_h200(None), brand=brand)], driver)
    report = diagnose(Options(profile="gpu96"))
    (finding,) = [f for f in report.findings if f.topic == "driver"]
    assert finding.level == level and says in finding.message, finding.message
