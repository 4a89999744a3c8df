"""Download the CPython 3.12 x86_64 wheels vLLM 0.24.0 needs that the H200 machine does not have.

    python3 tests/gpu/payload_deps.py DEST REQUIREMENT...    (run in a folder holding device_pkgs.txt)

Follows Requires-Dist (with extras, markers evaluated for CPython 3.12 on Linux x86_64) one wheel at a
time with `pip download --no-deps`, so nothing the machine already has (device_pkgs.txt, from
KINDS.md) and none of the heavy GPU kernels left out on purpose (SKIP) is fetched. Called by
make_payload.sh.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# Not brought over: the machine has torch/triton/numba, and the GPU kernel packages are hundreds of MB
# (hence VLLM_USE_FLASHINFER_SAMPLER=0 and gdn_prefill_backend=triton on the engine).
SKIP = {
    canonicalize_name(n)
    for n in [
        "torch", "torchvision", "torchaudio", "triton", "numba", "flashinfer-python", "flashinfer-cubin",
        "tilelang", "nvidia-cudnn-frontend", "fastsafetensors", "nvidia-cutlass-dsl", "quack-kernels",
        "tokenspeed-mla", "humming-kernels",
    ]
}  # fmt: skip
# xgrammar 0.2.9 needs apache-tvm-ffi >= 0.1.11 although vLLM pins 0.1.9 (its import fails with 0.1.9).
PIN = {"apache-tvm-ffi": "apache-tvm-ffi>=0.1.11"}
ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
    "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
}  # fmt: skip
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def downloaded(dest: Path) -> dict[str, Path]:
    return {canonicalize_name(w.name.split("-")[0]): w for w in dest.glob("*.whl")}


def requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate(ENV | {"extra": e}) for e in ["", *extras]):
            out.append(req)
    return out


def download(dest: Path, spec: str) -> bool:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", "-d", str(dest), spec]  # fmt: skip
    for platform in PLATFORMS:
        cmd[-3:-3] = ["--platform", platform]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode:
        print("FAILED", spec, result.stderr.strip().splitlines()[-1:], flush=True)
    return result.returncode == 0


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    device = {canonicalize_name(n) for n in Path("device_pkgs.txt").read_text().split() if n}
    queue = [Requirement(s) for s in sys.argv[2:]]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if name in SKIP or name in device or key in seen:
            continue
        seen.add(key)
        if name not in downloaded(dest):
            if not download(dest, PIN.get(name, f"{req.name}{req.specifier}")):
                continue
            print("got", downloaded(dest)[name].name, flush=True)
        queue.extend(requirements(downloaded(dest)[name], set(req.extras)))


if __name__ == "__main__":
    main()
