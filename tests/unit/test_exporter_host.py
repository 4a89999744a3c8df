"""The exporter's host collectors: the GPUs through NVML, the model cache's disk, and the engines' abort counters.

The build machine has no GPU: NVML is a fake module that raises pynvml's own exception classes
(`pynvml.NVMLError(code)` is the subclass NVML raises for that return code) and answers with pynvml's own
structures, with an H200's figures (tests/unit/test_doctor_gpu.py: 150,754,820,096 bytes; an SGLang engine
at mem-fraction 0.85 holds about 128 GB of it). The disk collector reads a real tmp_path through os.statvfs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack import deployment as D
from ornith_stack.cli import main
from ornith_stack.engines import ADAPTERS
from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter import host
from ornith_stack.exporter.collectors import collect_host, render
from ornith_stack.exporter.host import GpuCollector, ModelCacheCollector
from ornith_stack.exporter.httpd import Request
from ornith_stack.exporter.scrape import Target
from ornith_stack.exporter.server import App, Settings
from ornith_stack.nvml import NoGpu
from ornith_stack.wire.metrics import parse

pynvml = pytest.importorskip("pynvml")
REPO = Path(__file__).resolve().parents[2]
H200_BYTES = 150_754_820_096
ENGINE_HELD = 128_141_597_081  # 0.85 of it: SGLang's static pools


def error(code: int) -> Exception:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    used: int = ENGINE_HELD
    busy: int = 37  # percent, as nvmlDeviceGetUtilizationRates answers
    memory_error: int | None = None  # an NVML return code the memory query answers instead
    busy_error: int | None = None
    handle_error: int | None = None


@dataclass
class FakeNvml:
    """pynvml's names the collector uses, answering for `gpus`; `init_error`/`count_error` fail those calls."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None
    count_error: int | None = None
    inits: int = 0
    shutdowns: int = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVMLError"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        self.inits += 1
        if self.init_error is not None:
            raise error(self.init_error)

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        if self.count_error is not None:
            raise error(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:  # noqa: N802
        gpu = self.gpus[index]
        if gpu.handle_error is not None:
            raise error(gpu.handle_error)
        return gpu

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:  # noqa: N802
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> bytes:  # noqa: N802 (older bindings answer bytes)
        return gpu.name.encode()

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:  # noqa: N802
        if gpu.memory_error is not None:
            raise error(gpu.memory_error)
        return pynvml.c_nvmlMemory_t(total=H200_BYTES, free=H200_BYTES - gpu.used, used=gpu.used)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:  # noqa: N802
        if gpu.busy_error is not None:
            raise error(gpu.busy_error)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.busy, memory=20)


def scrape(*collectors: Any) -> str:
    return render(collect_host([(type(c).__name__, c) for c in collectors])).decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def gpu_series(text: str, name: str) -> dict[str, float]:
    """gpu index -> value."""
    return {dict(k)["gpu"]: v for k, v in samples(text, name).items()}


def state(text: str) -> str:
    found = [dict(k)["state"] for k, v in samples(text, C.GPU_NVML_STATE.series).items() if v == 1]
    assert len(found) == 1, found
    return found[0]


def two_h200() -> FakeNvml:
    return FakeNvml([FakeGpu("GPU-aaaa"), FakeGpu("GPU-bbbb", used=ENGINE_HELD - 1024, busy=100)])


def test_each_gpu_reports_memory_utilization_and_that_nvml_answered() -> None:
    text = scrape(GpuCollector("gpu96", "required", two_h200()))
    assert state(text) == "ok"
    assert gpu_series(text, C.GPU_UP.series) == {"0": 1.0, "1": 1.0}
    assert gpu_series(text, C.GPU_MEMORY_TOTAL.series) == {"0": H200_BYTES, "1": H200_BYTES}
    assert gpu_series(text, C.GPU_MEMORY_USED.series) == {"0": ENGINE_HELD, "1": ENGINE_HELD - 1024}
    assert gpu_series(text, C.GPU_UTILIZATION.series) == {"0": 0.37, "1": 1.0}
    labels = dict(next(iter(samples(text, C.GPU_UP.series))))
    assert labels == {"profile": "gpu96", "gpu": "0", "uuid": "GPU-aaaa", "name": "NVIDIA H200"}
    assert set(samples(text, C.COLLECT_DURATION.series)) == {(("collector", "GpuCollector"),)}


@pytest.mark.parametrize(("mode", "expected"), [("auto", "no_gpu"), ("required", "error")])
def test_a_host_without_an_nvidia_driver_is_no_gpu_unless_gpus_are_required(mode: str, expected: str) -> None:
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    text = scrape(GpuCollector("cpu-demo", mode, nvml))
    assert state(text) == expected
    assert not samples(text, C.GPU_UP.series) and not samples(text, C.GPU_MEMORY_USED.series)


def test_without_the_nvml_package_the_exporter_keeps_working(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise NoGpu("nvidia-ml-py is not installed (No module named 'pynvml')")

    monkeypatch.setattr(host, "nvml_module", missing)
    assert state(scrape(GpuCollector("cpu-demo", "auto"))) == "no_gpu"


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_UNKNOWN])
def test_a_gpu_host_whose_nvml_fails_is_an_error_even_in_auto(code: int) -> None:
    assert state(scrape(GpuCollector("gpu96", "auto", FakeNvml(init_error=code)))) == "error"


def test_an_nvml_error_mid_scrape_marks_that_gpu_down_and_the_rest_keep_reporting() -> None:
    nvml = two_h200()
    collector = GpuCollector("gpu96", "required", nvml)
    scrape(collector)
    nvml.gpus[1].memory_error = pynvml.NVML_ERROR_GPU_IS_LOST
    text = scrape(collector)
    assert state(text) == "ok"
    assert gpu_series(text, C.GPU_UP.series) == {"0": 1.0, "1": 0.0}
    assert set(gpu_series(text, C.GPU_MEMORY_USED.series)) == {"0"}
    # NVML itself stops answering: every GPU seen is reported lost, NVML restarts at the next scrape.
    nvml.count_error = pynvml.NVML_ERROR_UNKNOWN
    text = scrape(collector)
    assert state(text) == "error" and gpu_series(text, C.GPU_UP.series) == {"0": 0.0, "1": 0.0}
    assert nvml.shutdowns == 1
    nvml.count_error, nvml.gpus[1].memory_error = None, None
    text = scrape(collector)
    assert state(text) == "ok" and gpu_series(text, C.GPU_UP.series) == {"0": 1.0, "1": 1.0}
    assert nvml.inits == 2


def test_a_gpu_that_fell_off_the_bus_stays_visible_as_down() -> None:
    nvml = two_h200()
    collector = GpuCollector("gpu96", "auto", nvml)
    scrape(collector)
    del nvml.gpus[1]  # NVML no longer lists it
    text = scrape(collector)
    assert gpu_series(text, C.GPU_UP.series) == {"0": 1.0, "1": 0.0}
    assert {dict(k)["uuid"] for k in samples(text, C.GPU_UP.series)} == {"GPU-aaaa", "GPU-bbbb"}
    # NVML lists no GPU any more: both stay, down (not "no GPU": this host had them).
    nvml.gpus.clear()
    text = scrape(collector)
    assert state(text) == "ok" and gpu_series(text, C.GPU_UP.series) == {"0": 0.0, "1": 0.0}
    # NVML no longer starts (the driver went with them): an error, even in auto.
    collector2 = GpuCollector("gpu96", "auto", nvml := two_h200())
    scrape(collector2)
    nvml.count_error = pynvml.NVML_ERROR_GPU_IS_LOST
    scrape(collector2)
    nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    text = scrape(collector2)
    assert state(text) == "error" and gpu_series(text, C.GPU_UP.series) == {"0": 0.0, "1": 0.0}


def test_a_gpu_whose_handle_fails_keeps_the_labels_it_had() -> None:
    nvml = two_h200()
    collector = GpuCollector("gpu96", "auto", nvml)
    scrape(collector)
    nvml.gpus[0].handle_error = pynvml.NVML_ERROR_GPU_IS_LOST
    up = samples(scrape(collector), C.GPU_UP.series)
    assert {(dict(k)["gpu"], dict(k)["uuid"]): v for k, v in up.items()} == {("0", "GPU-aaaa"): 0.0,
                                                                             ("1", "GPU-bbbb"): 1.0}


def test_unified_memory_reports_utilization_without_memory_figures() -> None:
    """DGX Spark's GB10: the memory query answers NOT_SUPPORTED (tests/unit/test_doctor_gpu.py): no memory
    series, and the GPU is up."""
    nvml = FakeNvml([FakeGpu("GPU-spark", "NVIDIA GB10", memory_error=pynvml.NVML_ERROR_NOT_SUPPORTED)])
    text = scrape(GpuCollector("spark", "required", nvml))
    assert gpu_series(text, C.GPU_UP.series) == {"0": 1.0}
    assert not samples(text, C.GPU_MEMORY_USED.series) and gpu_series(text, C.GPU_UTILIZATION.series) == {"0": 0.37}


def test_the_model_cache_reports_its_file_system(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    missing = str(tmp_path / "not-mounted")
    text = scrape(ModelCacheCollector("gpu96", [str(tmp_path), missing]))
    size, free = samples(text, C.MODEL_CACHE_SIZE.series), samples(text, C.MODEL_CACHE_FREE.series)
    mine = (("path", str(tmp_path)), ("profile", "gpu96"))
    assert size == {mine: st.f_blocks * st.f_frsize}
    assert abs(free[mine] - st.f_bavail * st.f_frsize) < 64 * 2**20  # other writers on the machine
    assert samples(text, C.MODEL_CACHE_READABLE.series) == {mine: 1.0, (("path", missing), ("profile", "gpu96")): 0.0}


def test_free_bytes_are_what_an_unprivileged_writer_has(tmp_path: Path) -> None:
    """f_bavail, not f_bfree: root's reserve (5% on ext4) is no room for a download by the engine's user."""
    fake = os.statvfs_result((4096, 4096, 1000, 100, 50, 0, 0, 0, 0, 255))  # bsize, frsize, blocks, bfree, bavail
    text = scrape(ModelCacheCollector("p", ["/data/hf"], statvfs=lambda _: fake))
    assert samples(text, C.MODEL_CACHE_FREE.series) == {(("path", "/data/hf"), ("profile", "p")): 50 * 4096}
    assert samples(text, C.MODEL_CACHE_SIZE.series) == {(("path", "/data/hf"), ("profile", "p")): 1000 * 4096}


def test_the_exporter_serves_its_host_collectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "nvml_module", lambda: two_h200())
    app = App(Settings([Target("http://127.0.0.1:9")], timeout=0.5, profile="gpu96", gpu_metrics="required",
                       model_cache=(str(tmp_path),)))
    try:
        body = app.respond(Request("GET", "/metrics", "", {})).body.decode()
        page = app.respond(Request("GET", "/", "", {})).body.decode()
    finally:
        app.close()
    assert state(body) == "ok" and len(samples(body, C.GPU_UP.series)) == 2
    assert samples(body, C.MODEL_CACHE_READABLE.series) == {(("path", str(tmp_path)), ("profile", "gpu96")): 1.0}
    assert {dict(k)["collector"] for k in samples(body, C.COLLECT_DURATION.series)} == set(C.HOST_COLLECTORS)
    assert "GPU metrics: required" in page


def test_without_host_collectors_nothing_of_theirs_appears() -> None:
    app = App(Settings([Target("http://127.0.0.1:9")], timeout=0.5))
    try:
        body = app.respond(Request("GET", "/metrics", "", {})).body.decode()
    finally:
        app.close()
    assert "ornith_gpu_" not in body and "ornith_model_cache_" not in body and C.COLLECT_DURATION.name not in body


def test_the_host_samples_fit_the_exporter_job_s_sample_limit() -> None:
    gpus = FakeNvml([FakeGpu(f"GPU-{i}") for i in range(C.MAX_GPUS + 4)])
    text = scrape(GpuCollector("p", "required", gpus),
                  ModelCacheCollector("p", [f"/c{i}" for i in range(C.MAX_MODEL_CACHE_PATHS)]))
    assert len(samples(text, C.GPU_UP.series)) == C.MAX_GPUS
    found = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert len(found) <= C.max_host_samples()


@pytest.mark.parametrize(("args", "words"), [
    (["--gpu-metrics", "dcgm"], "--gpu-metrics"),
    (["--model-cache", ""], "--model-cache"),
    ([arg for i in range(C.MAX_MODEL_CACHE_PATHS + 1) for arg in ("--model-cache", f"/c{i}")], "at most"),
])
def test_the_command_refuses_bad_host_options(capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    assert main(["exporter", "--target", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and len(err.strip().splitlines()) == 1


# -- aborts: the engines' own counters under our names -------------------------------------------------

def test_vllm_counts_aborted_requests_among_the_finished() -> None:
    text = (REPO / "tests/fixtures/engines/vllm-0.24.0/ngram/metrics-final.txt").read_text()
    adapter = ADAPTERS["vllm"]
    found = parse(text, keep=adapter.sample_names())
    reasons = found.by_label("vllm:request_success_total", "finished_reason")
    assert adapter.finished_requests(found) == sum(reasons.values()) > 0
    assert adapter.aborted_requests(found) == reasons["abort"] == 0.0


def test_sglang_counts_abort_calls_from_the_first_one() -> None:
    """tests/fixtures/engines/sglang-0.5.17/canary-abort: one abort_all that ended four streams reads 1; before
    it the counter does not exist, so the exporter has no series (not a 0 that would later jump)."""
    adapter = ADAPTERS["sglang"]
    fixtures = REPO / "tests/fixtures/engines/sglang-0.5.17/canary-abort"
    before = parse((fixtures / "metrics-before.txt").read_text(), keep=adapter.sample_names())
    after = parse((fixtures / "metrics-after.txt").read_text(), keep=adapter.sample_names())
    assert adapter.aborted_requests(before) is None and adapter.aborted_requests(after) == 1.0
    assert adapter.finished_requests(after) == after.total("sglang:num_requests_total") > 1.0


# -- every deployment path wires the host collectors -------------------------------------------------

def exporter_service(profile: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose" / f"{profile}.yml").read_text())["services"]["exporter"]


def test_compose_gives_the_exporter_the_model_cache_read_only_and_a_gpu_profile_s_gpus() -> None:
    for profile in ("gpu96", "cpu-demo"):
        service = exporter_service(profile)
        command = service["command"]
        assert command[command.index("--model-cache") + 1] == D.HF_HOME_IN_CONTAINER
        assert f"${{ORNITH_HF_CACHE:-hf-cache}}:{D.HF_HOME_IN_CONTAINER}:ro" in service["volumes"]
    gpu, cpu = exporter_service("gpu96"), exporter_service("cpu-demo")
    assert gpu["command"][gpu["command"].index("--gpu-metrics") + 1] == D.GPU_METRICS_REQUIRED
    assert gpu["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    # A CPU profile: NVML's state reads no_gpu (the command's default, auto), no devices asked for.
    assert "--gpu-metrics" not in cpu["command"] and "deploy" not in cpu


def test_helm_s_sidecar_reads_the_pod_s_gpus_and_cache_and_a_separate_exporter_neither() -> None:
    test_helm = pytest.importorskip("test_helm")
    sidecar = test_helm.container(test_helm.engine_pod_specs(test_helm.rendered("ci/gpu96-data-parallel.yaml"))["single"],
                                  "exporter")
    args = sidecar["args"]
    assert args[args.index("--gpu-metrics") + 1] == "required" and args[args.index("--model-cache") + 1] == "/data/hf"
    assert {"name": "model-cache", "mountPath": "/data/hf", "readOnly": True} in sidecar["volumeMounts"]
    assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"} in sidecar["env"]
    separate = next(d for d in test_helm.find(test_helm.rendered("values-gpu96.yaml"), "Deployment")
                    if d["metadata"]["labels"]["app.kubernetes.io/component"] == "exporter")
    exporter = separate["spec"]["template"]["spec"]["containers"][0]
    assert exporter["args"][exporter["args"].index("--gpu-metrics") + 1] == "off"
    assert "--model-cache" not in exporter["args"] and "volumeMounts" not in exporter  # a ReadWriteOnce claim


def test_the_ansible_host_mode_unit_mounts_the_cache_and_asks_for_the_gpus() -> None:
    template = (REPO / "ansible/roles/monitoring/templates/exporter.service.j2").read_text()
    defaults = yaml.safe_load((REPO / "ansible/roles/monitoring/defaults/main.yml").read_text())
    common = {"ansible_managed": "managed", "monitoring_exporter_targets": ["http://127.0.0.1:30000"],
              "monitoring_exporter_unit_name": "ornith-exporter", "monitoring_exporter_hardening": True,
              "monitoring_exporter_image": "img", "monitoring_exporter_listen": "127.0.0.1:9400",
              "monitoring_exporter_profile": "gpu96", "monitoring_exporter_canary": True,
              "monitoring_exporter_canary_check": "answer", "monitoring_exporter_api_key": ""}
    env = jinja2.Environment()
    for gpus, mode in ((1, "required"), (0, "auto")):
        assert env.from_string(defaults["monitoring_exporter_gpu_metrics"]).render(ornith_gpu_count=gpus) == mode
    assert env.from_string(defaults["monitoring_exporter_model_cache"]).render(
        ornith_service_hf_cache="/var/lib/ornith/hf") == "/var/lib/ornith/hf"
    unit = env.from_string(template).render(**common, monitoring_exporter_gpu_metrics="required",
                                            monitoring_exporter_model_cache="/var/lib/ornith/hf")
    assert " --gpus all --env NVIDIA_DRIVER_CAPABILITIES=utility " in unit
    assert f" --volume /var/lib/ornith/hf:{D.HF_HOME_IN_CONTAINER}:ro " in unit
    assert f"--gpu-metrics required --model-cache {D.HF_HOME_IN_CONTAINER}" in unit
    cpu = env.from_string(template).render(**common, monitoring_exporter_gpu_metrics="auto",
                                           monitoring_exporter_model_cache="")
    start = next(line for line in cpu.splitlines() if line.startswith("ExecStart="))
    assert "--gpus" not in start and "--volume" not in start and "--model-cache" not in start
