"""Every default the planner assumes when a flag is absent, read in the pinned engine's own sources.

vLLM 0.24.0 from $ORNITH_VLLM024_SRC, SGLang 0.5.17 from $ORNITH_SGLANG0517_SRC and 0.5.21 from
$ORNITH_SGLANG0521_SRC (the Python files of the released wheels; scripts/test.sh unpacks them). Field defaults are read from the class bodies with
`ast`; SGLang's memory functions (`_handle_max_mamba_cache`, `_calculate_mamba_ratio`,
`resolve_max_num_reqs`, the DFlash cell scaling, the prefill capture sizes, the VLM fraction) are taken
out of its files and run on the planner's inputs, so the planner and the engine compute side by side.
Each check names the file and line where the engine states the value (0.5.17 / 0.24.0 wheels).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import numbers
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from ornith_stack.engines.sglang import accounting as sglang
from ornith_stack.engines.vllm import accounting as vllm
from ornith_stack.planner import GIB, plan_request, request_for_profile
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.common import attention_bytes_per_token
from ornith_stack.sizing.shapes import load_shape, shape_from_config

CACHE = Path(os.environ.get("ORNITH_CACHE_DIR", Path(__file__).resolve().parents[2] / ".cache"))
VLLM = Path(os.environ.get("ORNITH_VLLM024_SRC", CACHE / "vllm-0.24.0-src")) / "vllm"
SGLANG = Path(os.environ.get("ORNITH_SGLANG0517_SRC", CACHE / "sglang-0.5.17-src")) / "sglang" / "srt"
SGLANG21 = Path(os.environ.get("ORNITH_SGLANG0521_SRC", CACHE / "sglang-0.5.21-src")) / "sglang" / "srt"
SGLANG_RELEASES = {"0.5.17": SGLANG, "0.5.21": SGLANG21}


def _source(root: Path, rel: str) -> str:
    path = root / rel
    if not path.is_file():
        pytest.skip(f"{path} is missing (scripts/test.sh unpacks the engine wheels' Python files)")
    return path.read_text()


def class_default(root: Path, rel: str, cls: str, name: str) -> tuple[Any, int]:
    """(default, line) of field `name` in class `cls`: `name: T = value` or `Field(default=value)`."""
    tree = ast.parse(_source(root, rel))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == name:
            value = item.value
            if isinstance(value, ast.Call):  # pydantic Field(default=...)
                value = next(k.value for k in value.keywords if k.arg == "default")
            assert value is not None
            return ast.literal_eval(value), item.lineno
    raise AssertionError(f"{rel}: {cls}.{name} not found")


def module_constant(root: Path, rel: str, name: str) -> tuple[Any, int]:
    for item in ast.parse(_source(root, rel)).body:
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in item.targets):
            value = item.value
            if isinstance(value, ast.Call):  # frozenset({...})
                value = value.args[0]
            return ast.literal_eval(value), item.lineno
    raise AssertionError(f"{rel}: {name} not found")


def engine_function(root: Path, rel: str, name: str, env: dict[str, Any]) -> Any:
    """The engine's function (or method) `name`, compiled from its file with `env` as its globals."""
    return engine_definitions(root, rel, [name], env)[name]


def engine_definitions(root: Path, rel: str, names: list[str], env: dict[str, Any]) -> dict[str, Any]:
    """Several of the engine's functions and classes, compiled together from its file (a function's
    decorators dropped, a class's kept: `@dataclass`), so that they call each other as in the engine."""
    tree = ast.parse(_source(root, rel))
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names]
    for node in nodes:
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = []
    assert sorted({n.name for n in nodes}) == sorted(names), f"{rel}: not all of {names} found"
    namespace: dict[str, Any] = {"logger": logging.getLogger("engine"), "logging": logging, **env}
    exec(compile(ast.Module(nodes, []), f"{root / rel}", "exec"), namespace)  # noqa: S102
    return namespace


def line_of(root: Path, rel: str, text: str) -> int:
    lines = _source(root, rel).splitlines()
    found = [i for i, line in enumerate(lines, 1) if text in line]
    assert found, f"{rel}: {text!r} not found"
    return found[0]


# -- vLLM 0.24.0 ------------------------------------------------------------------------------------------


def test_vllm_gpu_memory_utilization_default() -> None:
    # vllm/config/cache.py:67 `gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)`
    value, line = class_default(VLLM, "config/cache.py", "CacheConfig", "gpu_memory_utilization")
    assert (value, line) == (vllm.DEFAULT_GPU_MEMORY_UTILIZATION, 67)


def test_vllm_kernel_block_size_default() -> None:
    # vllm/config/cache.py:46 `DEFAULT_BLOCK_SIZE: ClassVar[int] = 16`, used when --block-size is absent.
    value, line = class_default(VLLM, "config/cache.py", "CacheConfig", "DEFAULT_BLOCK_SIZE")
    assert (value, line) == (vllm.KERNEL_BLOCK_ALIGNMENT, 46)


def test_vllm_kv_and_ssm_cache_dtypes_default_to_auto() -> None:
    # vllm/config/cache.py:75 `cache_dtype = "auto"` (the model dtype) and :129 `mamba_ssm_cache_dtype =
    # "auto"` (Qwen3.5: the config's mamba_ssm_dtype): the planner's ServeSettings defaults.
    assert class_default(VLLM, "config/cache.py", "CacheConfig", "cache_dtype") == ("auto", 75)
    assert class_default(VLLM, "config/cache.py", "CacheConfig", "mamba_ssm_cache_dtype") == ("auto", 129)
    req = request_for_profile(load_profile("spark"))
    assert req.settings.kv_cache_dtype == "auto" and req.kv_dtype_bytes == 2


def test_vllm_prefix_caching_defaults_off_for_hybrid_models() -> None:
    # vllm/engine/arg_utils.py:2462 `default_prefix_caching = model_config.is_prefix_caching_supported`
    # and vllm/config/model.py:1832 `if attn_type == "hybrid": ... return False`.
    assert line_of(VLLM, "engine/arg_utils.py", "default_prefix_caching = model_config.is_prefix_caching_supported") == 2462
    model_py = _source(VLLM, "config/model.py").splitlines()
    assert model_py[1831].strip() == 'if attn_type == "hybrid":' and "return False" in "".join(model_py[1832:1838])
    req = request_for_profile(load_profile("spark"))
    bare = req.with_settings(enable_prefix_caching=None)
    assert vllm.prefix_caching(bare) is False
    assert plan_request(bare).engine_details["mamba_cache_mode"] == "none"


# -- SGLang 0.5.17: ServerArgs field defaults --------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "line", "planner"),
    [
        # server_args.py:765 mem_fraction_static = None: resolved by `_handle_gpu_memory_settings`.
        ("mem_fraction_static", 765, None),
        # server_args.py:882 page_size = None; overrides.py `_page_size_default` resolves it to 1 on CUDA.
        ("page_size", 882, None),
        # server_args.py:2490 mamba_full_memory_ratio = 0.9
        ("mamba_full_memory_ratio", 2490, sglang.DEFAULT_MAMBA_FULL_MEMORY_RATIO),
        # server_args.py:2498 mamba_radix_cache_strategy = "auto"
        ("mamba_radix_cache_strategy", 2498, "auto"),
        # server_args.py:2531 linear_attn_backend = "triton" (extra_buffer needs it)
        ("linear_attn_backend", 2531, sglang.DEFAULT_LINEAR_ATTN_BACKEND),
        # server_args.py:923 disable_radix_cache = False, :949 disable_overlap_schedule = False
        ("disable_radix_cache", 923, False),
        ("disable_overlap_schedule", 949, False),
        # server_args.py:770 max_running_requests = None (DFlash fills in 48), :2461 max_mamba_cache_size = None
        ("max_running_requests", 770, None),
        ("max_mamba_cache_size", 2461, None),
    ],
)
def test_sglang_server_args_defaults(field: str, line: int, planner: Any) -> None:
    assert class_default(SGLANG, "server_args.py", "ServerArgs", field) == (planner, line)


def test_the_planner_reads_absent_sglang_flags_as_those_defaults() -> None:
    settings = replace(request_for_profile(load_profile("gpu96")).settings, mamba_radix_cache_strategy=None)
    assert settings.enable_prefix_caching is None and settings.overlap_schedule is True
    assert settings.mamba_full_memory_ratio is None and settings.max_mamba_cache_size is None
    assert settings.block_size is None  # page size: DEFAULT_PAGE_SIZE
    assert sglang.DEFAULT_PAGE_SIZE == 1
    # overrides.py:2298 `return {"page_size": 1}` (CUDA, not MUSA)
    assert line_of(SGLANG, "arg_groups/overrides.py", 'return {"page_size": 1}') == 2298


def test_sglang_dflash_defaults() -> None:
    # arg_groups/speculative_hook.py:258 `server_args.max_running_requests = 48` (in _handle_dflash) and
    # :239 `inferred_block_size = 16` when the draft config names no block size.
    hook = _source(SGLANG, "arg_groups/speculative_hook.py").splitlines()
    assert hook[257].strip() == f"server_args.max_running_requests = {sglang.DFLASH_DEFAULT_MAX_RUNNING_REQUESTS}"
    assert hook[238].strip() == f"inferred_block_size = {sglang.DFLASH_DEFAULT_BLOCK_SIZE}"
    assert line_of(SGLANG, "arg_groups/speculative_hook.py", "def _handle_dflash(") == 147
    req = request_for_profile(load_profile("gpu96"))
    bare = req.with_settings(max_running_requests=None, draft_block_size=None)
    assert sglang.requested_running_requests(bare) == 48
    assert sglang.draft_tokens(bare) == 16  # the shipped draft config says block_size 16


def test_sglang_mamba_strategy_auto_resolves_to_extra_buffer_for_qwen3_5() -> None:
    # overrides.py:1432 `_MAMBA_EXTRA_BUFFER_ARCHS` holds Qwen3_5MoeForConditionalGeneration (:1436);
    # overrides.py:1494-1499: "auto" with the overlap scheduler on -> "extra_buffer" when supported on
    # the triton linear-attention backend (:1456), else "no_buffer" with the overlap scheduler off.
    archs, line = module_constant(SGLANG, "arg_groups/overrides.py", "_MAMBA_EXTRA_BUFFER_ARCHS")
    assert line == 1432 and "Qwen3_5MoeForConditionalGeneration" in archs
    assert sglang.MAMBA_EXTRA_BUFFER_ARCHS <= archs
    resolution = engine_function(SGLANG, "arg_groups/overrides.py", "_mamba_radix_cache_resolution", {
        "supports_mamba_cache_extra_buffer": engine_function(
            SGLANG, "arg_groups/overrides.py", "supports_mamba_cache_extra_buffer",
            {"_MAMBA_EXTRA_BUFFER_ARCHS": archs}),
        "_MAMBA_RADIX_CACHE_ARCHS": frozenset(), "Dict": dict, "Any": Any,
    })
    shape = load_shape("ornith-1.5-35b-a3b")

    def engine(**flags: Any) -> dict[str, Any]:
        hf = NS(architectures=[shape.architecture])
        defaults = {"disable_radix_cache": False, "mamba_radix_cache_strategy": "auto",
                    "disable_overlap_schedule": False, "page_size": None, "linear_attn_backend": "triton"}
        view = NS(get_model_config=lambda: NS(hf_config=hf), **{**defaults, **flags})
        registry = NS(get_linear_attn_spec_by_arch=lambda arch: NS(uses_mamba_radix_cache=True))
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "sglang.srt.configs.linear_attn_model_registry", registry)
            return resolution(view)

    req = request_for_profile(load_profile("gpu96"))
    assert engine()["mamba_radix_cache_strategy"] == "extra_buffer"
    assert sglang.resolve_mamba_strategy(req.with_settings(mamba_radix_cache_strategy=None)) == ("extra_buffer", True)
    declared = engine(disable_overlap_schedule=True)
    assert (declared["mamba_radix_cache_strategy"], declared["disable_overlap_schedule"]) == ("no_buffer", True)
    no_overlap = req.with_settings(mamba_radix_cache_strategy=None, overlap_schedule=False)
    assert sglang.resolve_mamba_strategy(no_overlap) == ("no_buffer", False)


def test_sglang_mamba_ratio_constants() -> None:
    # mem_cache/kv_cache_configurator.py:118 MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3, :120 +2
    # with the overlap scheduler, :122 +1 without.
    rel = "mem_cache/kv_cache_configurator.py"
    assert module_constant(SGLANG, rel, "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO") == (3, 118)
    assert module_constant(SGLANG, rel, "MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP") == (2, 120)
    assert module_constant(SGLANG, rel, "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP") == (1, 122)
    assert sglang.mamba_ratio("extra_buffer", radix=True, overlap=True) == 5
    assert sglang.mamba_ratio("extra_buffer", radix=True, overlap=False) == 4
    assert sglang.mamba_ratio("no_buffer", radix=True, overlap=False) == 3
    assert sglang.mamba_ratio("extra_buffer", radix=False, overlap=True) == 1


# -- SGLang 0.5.17: the memory functions, run on the planner's inputs -------------------------------------


class _Schedule(NS):
    pass


def _engine_mamba(req_rest_bytes: int, per_req: int, *, draft: int, requested: int | None, ratio_flags: dict[str, Any],
                  max_mamba_cache_size: int | None = None, radix: bool = True, root: Path = SGLANG) -> tuple[int, float]:
    """(max_mamba_cache_size, rest in GB after the state pool and verify buffers) from SGLang's own
    `_handle_max_mamba_cache` (0.5.17 kv_cache_configurator.py:1816) and `_calculate_mamba_ratio` (:1659);
    0.5.21 reads the same through its runtime contexts (get_exec().mamba) and its own attributes."""
    rel = "mem_cache/kv_cache_configurator.py"
    schedule = _Schedule(max_mamba_cache_size=max_mamba_cache_size, max_running_requests=requested,
                         mamba_full_memory_ratio=0.9, disable_overlap_schedule=not ratio_flags["overlap"])
    constants = {name: module_constant(root, rel, name)[0] for name in (
        "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO", "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
        "MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP", "MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP_LAZY",
        "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP", "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER")}
    env = {
        **constants,
        "get_schedule": lambda: schedule,
        "get_memory": lambda: NS(disable_radix_cache=not radix),
        "get_spec": lambda: NS(speculative_num_draft_tokens=draft),
        "get_exec": lambda: NS(mamba=NS(enable_linear_replayssm_spec=False, enable_mamba_extra_buffer_lazy=False,
                                        enable_mamba_extra_buffer=ratio_flags["extra_buffer"])),
        "get_context": lambda: NS(override=lambda source, **kw: schedule.__dict__.update(kw)),
        "envs": NS(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=NS(get=lambda: False)),
        "kimi_linear_config": lambda config: None,
        "get_pp_indices": None,
    }
    handle = engine_function(root, rel, "_handle_max_mamba_cache", env)
    ratio = engine_function(root, rel, "_calculate_mamba_ratio", env)
    server_args = NS(enable_mamba_extra_buffer=lambda: ratio_flags["extra_buffer"],
                     enable_mamba_extra_buffer_lazy=lambda: False, max_speculative_num_draft_tokens=None)
    me = NS(mambaish_config=NS(mamba2_cache_params=NS(layers=list(range(30)), mamba_cache_per_req=per_req)),
            server_args=server_args, ps=NS(pp_size=1, attn_dp_size=1), hybrid_gdn_config=NS(),
            spec_algorithm=NS(is_none=lambda: draft == 0), model_config=NS(num_hidden_layers=40),
            pp_size=1, attn_dp_size=1, hybrid_kda_config=None)
    me._calculate_mamba_ratio = lambda: ratio(me)
    rest_gb = handle(me, req_rest_bytes / (1 << 30))
    return schedule.max_mamba_cache_size, rest_gb


@pytest.mark.parametrize(
    ("profile", "gpu_gib", "changes"),
    [
        ("gpu96", None, {}),  # seed 000 on one GPU: 4 running requests, block 16
        ("a100x2", None, {}),  # seed 000 on two A100s (tp 2, fraction 0.80)
        ("gpu96", 141, {"max_running_requests": None}),  # DFlash's 48 on an H200
        ("gpu96", 141, {"max_mamba_cache_size": 200}),
        ("gpu96", 141, {"enable_prefix_caching": False}),  # radix cache off: slots = running requests
        ("gpu96", 141, {"overlap_schedule": False}),  # auto -> no_buffer, 3 slots per request
        ("gpu96", 141, {"speculative_method": None, "max_running_requests": None}),  # no speculation
    ],
)
def test_sglang_state_pool_and_running_requests_equal_the_engine_functions(
    profile: str, gpu_gib: float | None, changes: dict[str, Any]
) -> None:
    req = request_for_profile(load_profile(profile), gpu_memory_gib=gpu_gib).with_settings(**changes)
    sp = sglang.split(req)
    extra_buffer = sp.strategy == "extra_buffer"
    requested = sglang.requested_running_requests(req)
    slots, rest_gb = _engine_mamba(sp.rest, sp.per_request_state, draft=sp.draft_tokens, requested=requested,
                                   ratio_flags={"overlap": sp.overlap, "extra_buffer": extra_buffer},
                                   max_mamba_cache_size=req.settings.max_mamba_cache_size,
                                   radix=sglang.radix_cache(req))
    assert sp.mamba.slots == slots
    # SGLang works in float GB; the planner in bytes: equal to the byte.
    assert abs(sp.kv_rest - rest_gb * (1 << 30)) < 2
    # resolve_max_num_reqs (kv_cache_configurator.py:1719) on the planner's token capacity.
    schedule = _Schedule(max_running_requests=requested, max_mamba_cache_size=slots)
    resolve = engine_function(SGLANG, "mem_cache/kv_cache_configurator.py", "resolve_max_num_reqs",
                              {"get_schedule": lambda: schedule})
    me = NS(model_config=NS(context_len=req.max_model_len), ps=NS(attn_dp_size=1), mambaish_config=NS(),
            _calculate_mamba_ratio=lambda: sp.ratio)
    assert sp.running == resolve(me, sp.kv_tokens)


def test_sglang_dflash_kv_cell_equals_the_engine_scaling() -> None:
    # speculative/dflash_utils.py:68 scale_kv_cell_size_per_token_for_dflash, called from
    # model_executor/pool_configurator.py:163 with the target's full-attention cell and layer counts.
    scale = engine_function(SGLANG, "speculative/dflash_utils.py", "scale_kv_cell_size_per_token_for_dflash",
                            {"Optional": Any})
    for profile in ("gpu96", "a100x2"):
        req = request_for_profile(load_profile(profile))
        target = attention_bytes_per_token(req.shape, req.settings.tp, req.kv_dtype_bytes) * 10
        expected = scale(target_cell_size_per_token=target, target_num_layers=10, draft_num_layers=8)
        assert sglang.kv_cell_bytes(req) == expected


def test_sglang_prefill_capture_sizes_equal_the_engine_list() -> None:
    # server_args.py:4990 _generate_prefill_cuda_graph_batch_sizes
    generate = engine_function(SGLANG, "server_args.py", "_generate_prefill_cuda_graph_batch_sizes", {})
    for max_bs in (2048, 4096, 8192, 16384):
        assert sglang.prefill_capture_sizes(max_bs) == generate(None, max_bs)


def test_sglang_default_mem_fraction_static_follows_the_engine_heuristic() -> None:
    # server_args.py:4607 _handle_gpu_memory_settings: GPUs of 90-160 GiB (H200) take chunked prefill
    # 8192 and decode max_bs 256 at tp < 4 (:4670-4678); reserved = 512 + 1.5 x activation tokens
    # (:4773-4774) + tp/8 GiB (:4776) + graphs (reserve_for_graph_mb, :4882: 2 MiB per decode batch size,
    # 8 MiB per prefill capture size), at least 10 GiB above 60 GiB (:4778-4779), rounded to three decimals.
    text = _source(SGLANG, "server_args.py")
    for snippet in ("reserved_mem += activation_tokens * 1.5", "reserved_mem = max(reserved_mem, 10 * 1024)",
                    "round((gpu_mem - reserved_mem) / gpu_mem, 3)", "reserved_mem += decode_cuda_graph_config.max_bs * 2",
                    "reserved_mem += len(prefill_cuda_graph_config.bs) * 8",
                    "reserved_mem += self.tp_size * self.pp_size / 8 * 1024"):
        assert snippet in text, snippet
    assert sglang.chunked_prefill_and_decode_bs(141 * 1024, 1) == (8192, 256)
    reserved = 512 + 8192 * 1.5 + 1 / 8 * 1024 + 256 * 2 + len(sglang.prefill_capture_sizes(8192)) * 8
    assert sglang.reserved_mib(141, 1) == reserved
    # adjust_mem_fraction_for_vlm (server_args.py:9083), run on the 35B's vision config: SGLang reads
    # num_hidden_layers, absent from a Qwen3.5 vision config, so 24 layers of hidden 1152.
    adjust = engine_function(SGLANG, "server_args.py", "adjust_mem_fraction_for_vlm", {})
    me = NS(mem_fraction_static=round((141 * 1024 - reserved) / (141 * 1024), 3))
    adjust(me, NS(hf_config=NS(vision_config=NS(hidden_size=1152, depth=27))))
    shape = load_shape("ornith-1.5-35b-a3b")
    assert sglang.default_mem_fraction_static(141, 1, shape.vision) == pytest.approx(me.mem_fraction_static, abs=1e-12)


# -- SGLang 0.5.21 beside 0.5.17: the resolutions that moved or changed, run from each release's files ---


def _gb300x2() -> Any:
    return request_for_profile(load_profile("gb300x2"))


@pytest.mark.parametrize("release", SGLANG_RELEASES)
@pytest.mark.parametrize("backend", [None, "triton", "fa3", "flashinfer", "trtllm_mha", "fa4", "hpc_ops"])
@pytest.mark.parametrize("page", [None, 1, 16, 32, 64, 128])
def test_sglang_page_size_by_attention_backend_equals_the_engine(release: str, backend: str | None,
                                                                 page: int | None) -> None:
    """overrides.py's post-processes in their registration (file) order, on a CUDA Blackwell machine:
    `_mla_backend_page_constraints` (trtllm_mha: 16/32/64/128 else 64; hpc_ops: 64), `_fa4_page_constraint`
    (fa4: 128) and `_page_size_default` (unset: 1 on CUDA)."""
    root = SGLANG_RELEASES[release]
    cuda = NS(is_hip=False, is_musa=False, is_sm100=True)
    env = {"Any": Any, "is_sm100_supported": lambda: True, "is_hip": lambda: False, "is_musa": lambda: False,
           "get_platform": lambda: cuda, "use_mla_backend": lambda view: False, "envs": NS()}
    steps = engine_definitions(root, "arg_groups/overrides.py",
                               ["_mla_backend_page_constraints", "_fa4_page_constraint", "_page_size_default"], env)
    view = NS(attention_backend=backend, decode_attention_backend=None, prefill_attention_backend=None,
              speculative_draft_attention_backend=None, page_size=page, speculative_eagle_topk=None,
              use_mla_backend=lambda: False)
    for step in ("_mla_backend_page_constraints", "_fa4_page_constraint", "_page_size_default"):
        view.page_size = steps[step](view).get("page_size", view.page_size)
    req = _gb300x2().with_settings(attention_backend=backend, block_size=page)
    assert sglang.resolve_page_size(req) == view.page_size


@pytest.mark.parametrize("changes", [{}, {"max_running_requests": 8}, {"tp": 1}])
def test_sglang_0521_state_pool_and_running_requests_equal_the_engine_functions(changes: dict[str, Any]) -> None:
    """gb300x2 (0.5.21, tp 2, extra_buffer, 16 draft tokens) through 0.5.21's own `_handle_max_mamba_cache`,
    `_calculate_mamba_ratio` and `resolve_max_num_reqs` on the planner's rest (after weights, slack and
    the multimodal reservation)."""
    req = _gb300x2().with_settings(**changes)
    if changes.get("tp") == 1:
        req = replace(req, gpu_count=1).with_settings(mem_fraction_static=0.95)
        req = replace(req, gpu_memory_gib=560)  # a GPU the 122B fits on alone, so the pools exist
    sp = sglang.split(req)
    slots, rest_gb = _engine_mamba(sp.rest, sp.per_request_state, draft=sp.draft_tokens,
                                   requested=sp.requested_running, root=SGLANG21,
                                   ratio_flags={"overlap": sp.overlap, "extra_buffer": sp.strategy == "extra_buffer"})
    assert sp.mamba.slots == slots > 0
    assert abs(sp.kv_rest - rest_gb * (1 << 30)) < 2
    schedule = _Schedule(max_running_requests=sp.requested_running, max_mamba_cache_size=slots)
    resolve = engine_function(SGLANG21, "mem_cache/kv_cache_configurator.py", "resolve_max_num_reqs",
                              {"get_schedule": lambda: schedule})
    me = NS(model_config=NS(context_len=req.max_model_len), attn_dp_size=1, mambaish_config=NS(),
            _calculate_mamba_ratio=lambda: sp.ratio)
    assert sp.running == resolve(me, sp.kv_tokens)


def test_sglang_releases_are_chosen_by_the_profiles_engine_version() -> None:
    assert sglang.release_for("0.5.21").name == "0.5.21" and sglang.release_for("0.5.17").name == "0.5.17"
    assert sglang.release_for("0.5.19").name == "0.5.17" and sglang.release_for("0.6.0").name == "0.5.21"
    assert sglang.release_for(None).name == "0.5.17"
    assert plan_request(_gb300x2()).engine_details["accounting_release"] == "0.5.21"
    assert plan_request(request_for_profile(load_profile("gpu96"))).engine_details["accounting_release"] == "0.5.17"


@pytest.mark.parametrize("transport", [None, "cpu", "cuda_ipc", "cuda_vmm"])
def test_sglang_0521_multimodal_reservation_equals_the_engine(transport: str | None) -> None:
    # kv_cache_configurator.py:154 mm_runtime_reservation_gb, subtracted in _profile_available_bytes
    # (:2204); environ.py:1409 SGLANG_VLM_CACHE_SIZE_MB = EnvInt(100), :1433 SGLANG_MM_FEATURE_CACHE_MB 1024.
    rel = "mem_cache/kv_cache_configurator.py"
    assert line_of(SGLANG21, "environ.py", "SGLANG_VLM_CACHE_SIZE_MB = EnvInt(100)") == 1409
    assert line_of(SGLANG21, "environ.py", "SGLANG_MM_FEATURE_CACHE_MB = EnvInt(1 * 1024)") == 1433
    assert line_of(SGLANG21, rel, "rest_memory = available_gpu_memory - slack_gb - mm_reservation_gb") > 2190
    envs = NS(SGLANG_VLM_CACHE_SIZE_MB=NS(get=lambda: 100), SGLANG_MM_FEATURE_CACHE_MB=NS(get=lambda: 1024))
    reserve = engine_function(SGLANG21, rel, "mm_runtime_reservation_gb", {"envs": envs, "Optional": Any})
    req = _gb300x2()
    req = req.with_settings(extra={**req.settings.extra, "mm-feature-transport": transport} if transport
                            else req.settings.extra)
    rel21 = sglang.release_for("0.5.21")
    assert req.shape.vision is not None  # the composite Qwen3.5 config: SGLang's is_multimodal
    assert sglang.mm_reservation_bytes(req, rel21) == reserve(is_multimodal=True, mm_feature_transport=transport) * GIB
    # --language-model-only makes the model not multimodal (configs/model_config.py is_lm_only).
    text_only = req.with_settings(language_model_only=True)
    assert sglang.mm_reservation_bytes(text_only, rel21) == reserve(is_multimodal=False, mm_feature_transport=transport)
    assert sglang.mm_reservation_bytes(req, sglang.release_for("0.5.17")) == 0  # 0.5.17 has no reservation
    sp = sglang.split(req)
    loaded = req.weights_per_gpu() + req.draft_weights_per_gpu() + sp.extras.total
    without = sglang.static_pool_rest(int(req.memory_before_load_gib * GIB), loaded, sp.mem_fraction_static)
    assert without - sp.rest == sp.mm_reservation > 0


def test_sglang_0521_default_mem_fraction_follows_memory_hook() -> None:
    # 0.5.21 moved the heuristic to arg_groups/memory_hook.py handle_gpu_memory_settings: the same
    # reserve (:304-307, graphs in reserve_for_graph_mb), 0.95 when the GPU memory is unknown (:320), the
    # VLM share skipped with --language-model-only (:279); GPUs of 20-35 GiB take 4096 / 48 (tp < 4).
    hook = "arg_groups/memory_hook.py"
    for snippet in ("reserved_mem += activation_tokens * 1.5", "reserved_mem = max(reserved_mem, 10 * 1024)",
                    "round((gpu_mem - reserved_mem) / gpu_mem, 3)", "else 0.95", "and not cfg.language_model_only",
                    "reserved_mem += decode_cuda_graph_config.max_bs * 2",
                    "reserved_mem += len(prefill_cuda_graph_config.bs) * 8",
                    "reserved_mem += cfg.tp_size * cfg.pp_size / 8 * 1024"):
        assert snippet in _source(SGLANG21, hook), snippet
    rel21 = sglang.release_for("0.5.21")
    assert sglang.chunked_prefill_and_decode_bs(24 * 1024, 1, rel21) == (4096, 48)
    assert sglang.chunked_prefill_and_decode_bs(24 * 1024, 1) == (2048, 24)  # 0.5.17
    adjust = engine_function(SGLANG21, hook, "adjust_mem_fraction_for_vlm", {})
    shape = load_shape("ornith-1.5-35b-a3b")
    base = round((141 * 1024 - sglang.reserved_mib(141, 1, rel21)) / (141 * 1024), 3)
    engine = adjust(base, NS(hf_config=NS(vision_config=NS(hidden_size=1152, depth=27))), False, 141 * 1024)
    assert sglang.default_mem_fraction_static(141, 1, shape.vision, rel21) == pytest.approx(engine, abs=1e-12)
    req = request_for_profile(load_profile("gpu96"), gpu_memory_gib=141)
    req = replace(req, engine_version="0.5.21").with_settings(mem_fraction_static=None)
    assert sglang.resolve_mem_fraction_static(req) == pytest.approx(engine, abs=1e-12)
    assert sglang.resolve_mem_fraction_static(req.with_settings(language_model_only=True)) == base


def test_sglang_0521_dflash_kv_cell_adds_the_drafts_own_kv() -> None:
    # model_executor/pool_configurator.py:260-272 passes draft_cell_size_per_token (speculative/dflash_utils.py
    # dflash_draft_cell_size_per_token: KV heads per rank x (head_dim + v_head_dim) x layers x dtype bytes);
    # scale_kv_cell_size_per_token_for_dflash then sums the two.
    utils = "speculative/dflash_utils.py"
    fns = engine_definitions(SGLANG21, utils, ["dflash_draft_cell_size_per_token",
                                               "scale_kv_cell_size_per_token_for_dflash"],
                             {"Any": Any, "Optional": Any, "torch": NS(_utils=NS(_element_size=lambda d: d))})
    for tp in (1, 2):
        req = _gb300x2().with_settings(tp=tp)
        draft = req.draft
        config = NS(get_num_kv_heads=lambda t, d=draft: max(1, d.num_key_value_heads // t), head_dim=draft.head_dim,
                    v_head_dim=draft.head_dim)
        draft_cell = fns["dflash_draft_cell_size_per_token"](draft_model_config=config, draft_num_layers=draft.num_layers,
                                                            draft_kv_cache_dtype=2, tp_size=tp)
        target = attention_bytes_per_token(req.shape, tp, 2) * req.shape.num_full_attention_layers
        expected = fns["scale_kv_cell_size_per_token_for_dflash"](
            target_cell_size_per_token=target, target_num_layers=req.shape.num_full_attention_layers,
            draft_num_layers=draft.num_layers, draft_cell_size_per_token=draft_cell)
        assert sglang.kv_cell_bytes(req, sglang.release_for("0.5.21")) == expected == plan_request(req).kv_bytes_per_token


@pytest.mark.parametrize("release", SGLANG_RELEASES)
@pytest.mark.parametrize("draft", ["qwen3.5-35b-a3b-dflash", "ornith-1.5-122b-dflash2", "top-level-only",
                                   "nested-wins"])
def test_sglang_dflash_block_size_is_read_where_the_engine_reads_it(release: str, draft: str) -> None:
    """speculative/dflash_utils.py parse_dflash_draft_config: dflash_config.block_size, else the top-level
    key ("Keep support for current checkpoints where block_size is top-level"); both releases."""
    root = SGLANG_RELEASES[release]
    utils = "speculative/dflash_utils.py"
    names = ["parse_dflash_draft_config", "DFlashDraftConfig", "_get_dflash_config", "_get_text_config",
             "_cfg_get", "_parse_optional_int"]
    parse = engine_definitions(root, utils, names, {
        "Any": Any, "Optional": Any, "List": list, "Tuple": tuple, "dataclass": dataclasses.dataclass,
        "Integral": numbers.Integral, "DEFAULT_DFLASH_MASK_TOKEN": "<|MASK|>",
    })["parse_dflash_draft_config"]
    if draft in ("top-level-only", "nested-wins"):
        config = {"architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_attention_heads": 4,
                  "num_hidden_layers": 2, "vocab_size": 32, "max_position_embeddings": 128, "block_size": 8,
                  "dflash_config": {"target_layer_ids": [1]} | ({"block_size": 4} if draft == "nested-wins" else {})}
        shape = shape_from_config(config)
    else:
        shape = load_shape(draft)
        config = json.loads(Path(shape.source).read_text())
    assert shape.block_size == parse(draft_hf_config=config).resolve_block_size(default=None)


# -- the MoE runner on sm10x and its padding; what SGLang sizes from on an integrated GPU (issue 41) ----------

QWEN_MOE = {"0.5.17": ("arg_groups/overrides.py", 1291), "0.5.21": ("arg_groups/model_overrides/qwen3_moe.py", 38)}


@pytest.mark.parametrize("release", ["0.5.17", "0.5.21"])
def test_sglang_picks_the_trtllm_moe_runner_where_the_planner_counts_its_padding(release: str) -> None:
    """`_qwen3_moe_family_overrides` run on the planner's cases: flashinfer_trtllm exactly when the GPU is sm10x,
    the model unquantized (or fp8 / modelopt_fp4), --moe-a2a-backend none and --moe-runner-backend auto."""
    root, (rel, line) = SGLANG_RELEASES[release], QWEN_MOE[release]
    assert line_of(root, rel, "def _qwen3_moe_family_overrides(") == line
    names = ["_qwen3_moe_family_overrides"] + (["_mixed_precision_moe_quant_algos"] if release == "0.5.21" else [])
    req = request_for_profile(load_profile("gb300x2" if release == "0.5.21" else "gpu96"))
    rel_ = sglang.release_for(release)
    for sm in ("10.0", "10.3", "9.0", "12.0"):
        for quant in (None, "fp8", "awq"):
            for a2a in ("none", "deepep"):
                for runner in ("auto", "triton"):
                    env = {"is_sm100_supported": lambda sm=sm: sm.startswith("10."),
                           "get_platform": lambda sm=sm: NS(is_sm100=sm.startswith("10.")),
                           "resolving_view": lambda args: args, "envs": NS(), "Dict": dict, "Any": Any,
                           "get_quantization_config": lambda config, quant=quant: quant}
                    engine = engine_definitions(root, rel, names, env)["_qwen3_moe_family_overrides"]
                    args = NS(quantization=None, _quantization_explicitly_unset=False, moe_a2a_backend=a2a,
                              moe_runner_backend=runner)
                    picked = engine(args, NS(architectures=[req.shape.architecture])).get("moe_runner_backend")
                    extra = {**req.settings.extra, "moe-a2a-backend": a2a, "moe-runner-backend": runner}
                    planned = replace(req, compute_capability=sm,
                                      shape=replace(req.shape, quantization=quant)).with_settings(extra=extra)
                    ours = sglang.moe_runner(planned, rel_)
                    assert (picked or (runner if runner != "auto" else None)) == ours, (release, sm, quant, a2a, runner)


@pytest.mark.parametrize("release", ["0.5.17", "0.5.21"])
def test_sglang_pads_the_experts_per_gpu_to_128_with_the_trtllm_runner(release: str) -> None:
    """layers/moe/fused_moe_triton/layer.py `FusedMoE.__init__` (0.5.17:320, 0.5.21:420): with either trtllm runner
    `intermediate_size_per_partition` (moe_intermediate_size / moe_tp_size) is rounded up to a multiple of 128."""
    root = SGLANG_RELEASES[release]
    rel = "layers/moe/fused_moe_triton/layer.py"
    start = line_of(root, rel, "# flashinfer_trtllm kernel requires intermediate_size to be a multiple of 128")
    assert start == {"0.5.17": 320, "0.5.21": 420}[release]
    block = "\n".join(_source(root, rel).splitlines()[start - 1:start + 8])
    assert "self.use_flashinfer_trtllm_moe" in block and "self.intermediate_size_per_partition % 128 != 0" in block
    assert "round_up(\n                self.intermediate_size_per_partition, 128" in block
    assert sglang.TRTLLM_MOE_ALIGN == 128
    req = request_for_profile(load_profile("gpu96"), gpu_count=8, setting_overrides={"tp": 8}, compute_capability="10.0")
    # Ornith-1.5-35B-A3B: 512 / 8 = 64 -> 128 on 40 layers x 256 experts x (gate, up, down) x 2048 x 2 bytes.
    assert sglang.moe_padding_bytes(req) == 40 * 256 * 3 * 2048 * (128 - 64) * 2 == 8_053_063_680
    assert sglang.moe_padding_bytes(req.with_settings(tp=4)) == 0  # 128 per GPU


@pytest.mark.parametrize("release", ["0.5.17", "0.5.21"])
def test_sglang_sizes_from_the_hosts_available_memory_on_an_integrated_gpu(release: str) -> None:
    """utils/common.py `get_available_gpu_memory` (0.5.17:423, 0.5.21:445): on a GPU whose device properties say
    `is_integrated` (GB10) SGLang reads `psutil.virtual_memory().available` (MemAvailable), not cudaMemGetInfo."""
    root = SGLANG_RELEASES[release]
    start = line_of(root, "utils/common.py", "def get_available_gpu_memory(")
    lines = _source(root, "utils/common.py").splitlines()[start:start + 40]
    branch = next(i for i, line in enumerate(lines) if line.strip() == "if props.is_integrated:")
    assert start + branch + 1 == {"0.5.17": 423, "0.5.21": 445}[release]
    assert lines[branch + 5].strip() == "free_gpu_memory = psutil.virtual_memory().available"
