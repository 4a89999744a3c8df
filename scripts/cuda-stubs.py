"""Build stand-ins for the CUDA libraries that PyPI's torch links to, so it imports and runs on CPU.

PyPI serves torch for Linux only as a CUDA build: its libraries name libcudart, libcublas, libcudnn,
libnccl, ... as DT_NEEDED, and pip would bring about 3 GB of nvidia-* wheels to satisfy them. On a
machine without a GPU nothing in them is ever called for real, so each missing library is replaced by
a small shared object, built here with the C compiler, that defines every symbol torch imports from
it (with the same symbol versions) and answers "no device" / "not supported":

- cudaGetDeviceCount sets 0 and returns cudaErrorNoDevice, so torch.cuda.is_available() is False;
- *GetErrorString / *GetErrorName / *GetStatusString return a static message;
- every other function returns a non-zero status (an error in every CUDA library's convention).

The stand-ins go into torch/lib, which every torch library has on its RPATH ($ORIGIN).

    python scripts/cuda-stubs.py            # with the python whose torch needs them
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tempfile
from collections import defaultdict
from pathlib import Path

# Loaded only on demand (the NVRTC JIT wrapper, which alone needs the driver libcuda).
SKIP_LIBS = {"libcaffe2_nvrtc.so"}
SYSTEM_VERSIONS = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC|GOMP|OMP|OACC)_")
STRING_FUNCS = re.compile(r"Get(Error|Status)(String|Name)$|GetErrorString|StatusString")
MARKER = "ornith_cuda_stand_in"  # defined by every stand-in, so a re-run rebuilds instead of trusting it
MESSAGE = "no CUDA on this machine (torch runs with CPU stand-ins of the CUDA libraries)"


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def needed(lib: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", run("readelf", "-d", str(lib)))


def undefined(lib: Path) -> list[tuple[str, str | None]]:
    """(symbol, version or None) for each strong undefined dynamic symbol of `lib`."""
    result = []
    for line in run("nm", "-D", "--undefined-only", "--with-symbol-versions", str(lib)).splitlines():
        kind, _, name = line.strip().partition(" ")
        if kind != "U":
            continue
        symbol, _, version = name.partition("@")
        result.append((symbol, version.lstrip("@") or None))
    return result


def defined(lib: Path) -> set[str]:
    out = run("nm", "-D", "--defined-only", str(lib))
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def resolvable(name: str) -> bool:
    """Whether the system's loader already finds `name` (libc, libstdc++, ...)."""
    return f"{name} " in run("/sbin/ldconfig", "-p") or Path("/lib64", name).exists()


def closure(start: list[Path], libdir: Path) -> tuple[list[Path], set[str]]:
    """torch's own libraries reachable from `start`, and the NEEDED names found nowhere."""
    seen: dict[str, Path] = {}
    missing: set[str] = set()
    todo = list(start)
    while todo:
        lib = todo.pop()
        for name in needed(lib):
            if name in seen or name in missing or name in SKIP_LIBS:
                continue
            if (libdir / name).exists() and MARKER not in defined(libdir / name):
                seen[name] = libdir / name
                todo.append(libdir / name)
            elif not resolvable(name) and not any(libdir.parent.parent.glob(f"nvidia/**/{name}")):
                # (torch's RPATH also searches site-packages/nvidia/*/lib, where pip puts the real ones)
                missing.add(name)
    return [*start, *seen.values()], missing


def stub_source(symbols: set[str]) -> str:
    lines = [f'static const char msg[] = "{MESSAGE}";', f"int {MARKER} = 1;"]
    for sym in sorted(symbols):
        if sym == "cudaGetDeviceCount":
            lines.append("int cudaGetDeviceCount(int *n) { if (n) *n = 0; return 100; }")
        elif STRING_FUNCS.search(sym):
            lines.append(f"const char *{sym}(void) {{ return msg; }}")
        else:
            lines.append(f"int {sym}(void) {{ return 999; }}")
    return "\n".join(lines) + "\n"


def version_script(versions: dict[str, set[str]]) -> str:
    return "".join(f"{v} {{ global: {'; '.join(sorted(syms))}; }};\n" for v, syms in sorted(versions.items()))


def build(torch_dir: Path) -> list[str]:
    libdir = torch_dir / "lib"
    start = sorted(torch_dir.glob("_C*.so"))
    libs, missing = closure(start, libdir)
    if not missing:
        return []
    # Other extensions built against CUDA torch (torchvision/_C.so) import CUDA symbols of their own.
    libs += [
        so
        for so in sorted(torch_dir.parent.glob("*/**/*.so"))
        if not so.is_relative_to(torch_dir) and missing & set(needed(so))
    ]
    provided: set[str] = set()
    for lib in libs:
        provided |= defined(lib)
    system = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"}
    system_syms: set[str] = set()
    for name in system:
        for path in ("/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64"):
            if Path(path, name).exists():
                system_syms |= defined(Path(path, name))
                break
    # symbol -> version per missing library; unversioned ones go into the first stand-in.
    by_lib: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    unversioned: set[str] = set()
    for lib in libs:
        for sym, version in undefined(lib):
            if version and SYSTEM_VERSIONS.match(version):
                continue
            if version in missing:
                by_lib[version][version].add(sym)
            elif version is None and sym not in provided and sym not in system_syms:
                unversioned.add(sym)
            elif version is not None and version not in missing:
                by_lib[_owner(version, missing)][version].add(sym)
    # Unversioned imports bind to any loaded definition: give them to a stand-in without version
    # nodes (ld cannot mix an anonymous node with named ones), else to the first named node.
    first = next((n for n in sorted(missing) if n not in by_lib), min(missing))
    if first in by_lib:
        next(iter(by_lib[first].values())).update(unversioned)
    else:
        by_lib[first][""] = unversioned
    built = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(missing):
            versions = by_lib.get(name, {})
            symbols: set[str] = set().union(*versions.values())
            named = {v: syms for v, syms in versions.items() if v}
            if named:
                named[min(named)] = named[min(named)] | {MARKER}
            src, script = Path(tmp, f"{name}.c"), Path(tmp, f"{name}.map")
            src.write_text(stub_source(symbols))
            script.write_text(version_script(named))
            cmd = ["cc", "-shared", "-fPIC", "-O0", "-o", str(libdir / name), f"-Wl,-soname,{name}", str(src)]
            if named:
                cmd.append(f"-Wl,--version-script={script}")
            subprocess.run(cmd, check=True)
            built.append(f"{name} ({len(symbols)} symbols)")
    return built


def _owner(version: str, missing: set[str]) -> str:
    """The missing library that must define `version` (e.g. NVSHMEM -> libnvshmem_host.so.3)."""
    key = version.lower().split(".so")[0].removeprefix("lib")
    for name in sorted(missing):
        if key in name.lower():
            return name
    raise SystemExit(f"cuda-stubs: no missing library provides symbol version {version}")


if __name__ == "__main__":
    site = Path(sysconfig.get_paths()["purelib"])
    torch_dir = site / "torch"
    if not torch_dir.is_dir():
        sys.exit(f"cuda-stubs: no torch in {site}")
    for line in build(torch_dir):
        print(f"cuda-stubs: built {line}")
