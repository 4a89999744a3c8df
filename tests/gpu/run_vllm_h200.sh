#!/usr/bin/env bash
# GPU validation run of the pinned vLLM 0.24.0 on the H200 machine (issue 3, part 4).
#
# The machine has torch 2.11.0+cu130 and transformers 5.17 but no vLLM and no network, receives at
# most 64 MiB per call and stays warm about 30 s between calls. So the payload (made here by
# tests/gpu/make_payload.sh into the ignored folder .gpu/) arrives in parts over consecutive calls and
# is kept under $W (/tmp, lives as long as the machine stays warm):
#
#   bash tests/gpu/run_vllm_h200.sh stage .gpu/xfer1          # deps + part 1; makes the tiny models
#   bash tests/gpu/run_vllm_h200.sh stage .gpu/xfer2          # part 2
#   bash tests/gpu/run_vllm_h200.sh serve auto .gpu/xfer3     # part 3, unpack, serve, traffic, record
#
#   bash tests/gpu/run_vllm_h200.sh serve ngram               # next call, same warm machine
#
# serve MODE: dflash | ngram | auto (dflash, then ngram if dflash does not come up; the reason is kept).
# With the engine healthy it starts `ornith-stack exporter` against it, sends tests/gpu/traffic.py's
# chat traffic, runs `ornith-stack bench`, scrapes both /metrics, stops everything and runs
# `pytest -m gpu tests/gpu`. Results land in $OUT (what the device tool brings back): results.tar.gz
# with everything, plus the loose files of the last mode that served (metrics.txt, engine.log,
# chat-completion.json, summary.json, exporter-metrics.txt, bench.md).
set -uo pipefail

W=${ORNITH_GPU_WORK:-/tmp/ornith-gpu}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$W/out}
PORT=${ORNITH_GPU_PORT:-8000}
MODEL_NAME=ornith-tiny
START=$(date +%s)
mkdir -p "$W"/{parts,site,models,runs} "$OUT"

export PYTHONPATH="$W/site:$REPO/src"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT="$W/cache"
# flashinfer is not brought over (hundreds of MB); its sampler is vLLM's default on CUDA.
export VLLM_USE_FLASHINFER_SAMPLER=0

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*"; }
elapsed() { echo $(( $(date +%s) - START )); }

stage() {  # copy one carried folder of parts into $W/parts
    local src=$1
    cp "$src"/* "$W/parts/" && log "staged $(cd "$src" && printf '%s ' *)"
    ls -la "$W/parts"
    if [ -f "$W/parts/deps.tar.xz" ] && [ ! -f "$W/site/.deps" ]; then
        xz -dc "$W/parts/deps.tar.xz" | tar -x -C "$W/site" && touch "$W/site/.deps" && log "deps unpacked"
    fi
}

unpack_vllm() {
    [ -f "$W/site/.vllm" ] && return 0
    (cd "$W/parts" && sha256sum -c --quiet manifest.sha256) || { log "parts incomplete or corrupt"; return 1; }
    cat "$W"/parts/vllm.tar.xz.part-* | xz -dc -T0 | tar -x -C "$W/site" || return 1
    touch "$W/site/.vllm"
    log "vllm unpacked: $(du -sh "$W/site" | cut -f1)"
}

machine_facts() {
    {
        date -u +%Y-%m-%dT%H:%M:%SZ
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        uname -r
        python3 -V
        python3 -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|tokenizers|numpy|numba|triton|protobuf|setuptools|huggingface.hub|safetensors|typer|rich|httpx|jinja2|pyyaml|prometheus.client) '
    } > "$W/machine.txt" 2>&1
    cat "$W/machine.txt"
}

make_models() {
    [ -f "$W/models/.done" ] && return 0
    # The project's own tiny model (composite Qwen3_5MoeForConditionalGeneration with a tiny vision
    # tower: vLLM 0.24.0 rejects a bare Qwen3_5MoeTextConfig; served with --language-model-only).
    if python3 -m ornith_stack tiny-model --help >/dev/null 2>&1; then
        python3 -m ornith_stack tiny-model "$W/models/target" --with-vision || return 1
    else
        python3 -c "from pathlib import Path; from ornith_stack.tiny_model import make_tiny_model; \
make_tiny_model(Path('$W/models/target'), 'qwen3_5_moe', with_vision=True)" || return 1
    fi
    python3 "$REPO/tests/gpu/make_dflash_draft.py" "$W/models/target" "$W/models/draft" || return 1
    touch "$W/models/.done"
    log "models: $(du -sh "$W/models/target" "$W/models/draft" | tr '\n' ' ')"
}

engine_args() {  # $1 = mode
    local spec
    case $1 in
        dflash) spec="{\"method\":\"dflash\",\"model\":\"$W/models/draft\",\"num_speculative_tokens\":15}" ;;
        ngram) spec='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}' ;;
    esac
    ENGINE_ARGS=(--model "$W/models/target" --served-model-name "$MODEL_NAME" --language-model-only
        --max-model-len 4096 --kv-cache-memory-bytes 8589934592 --max-num-seqs 32 --seed 0
        --additional-config '{"gdn_prefill_backend":"triton"}'
        --speculative-config "$spec" --host 127.0.0.1 --port "$PORT")
}

wait_healthy() {  # $1 = pid, $2 = deadline (s since START)
    while [ "$(elapsed)" -lt "$2" ]; do
        kill -0 "$1" 2>/dev/null || return 1
        python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
            >/dev/null 2>&1 && return 0
        sleep 2
    done
    return 1
}

stop_engine() {
    [ -n "${EPID:-}" ] || return 0
    kill -TERM -- "-$EPID" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$EPID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$EPID" 2>/dev/null
    EPID=
}
trap 'stop_exporter; stop_engine' EXIT

# The project's exporter and benchmark, run against the live engine when this tree has them.
EXPORTER_PORT=${ORNITH_GPU_EXPORTER_PORT:-9400}
has_command() { python3 -m ornith_stack "$1" --help >/dev/null 2>&1; }

scrape_exporter() {  # $1 = file for the exporter's /metrics text
    python3 -c "import urllib.request,sys; open(sys.argv[2],'wb').write(urllib.request.urlopen(sys.argv[1], timeout=15).read())" \
        "http://127.0.0.1:$EXPORTER_PORT/metrics" "$1" 2>/dev/null
}

start_exporter() {  # started before the traffic, so its rate windows see it
    XPID=
    has_command exporter || { log "this tree has no 'ornith-stack exporter': skipped"; return 0; }
    setsid python3 -m ornith_stack exporter --target "http://127.0.0.1:$PORT" \
        --listen "127.0.0.1:$EXPORTER_PORT" > "$1/exporter.log" 2>&1 &
    XPID=$!
    for _ in $(seq 30); do scrape_exporter "$1/exporter-metrics-before.txt" && { log "exporter up"; return 0; }; sleep 1; done
    log "exporter did not answer:"; tail -n 20 "$1/exporter.log"
}

stop_exporter() {
    [ -n "${XPID:-}" ] || return 0
    kill -TERM -- "-$XPID" 2>/dev/null; sleep 1; kill -KILL -- "-$XPID" 2>/dev/null
    XPID=
}

run_bench() {  # sized for the tiny model: max-model-len 4096, garbage answers, well inside one call
    has_command bench || { log "this tree has no 'ornith-stack bench': skipped"; return 0; }
    log "bench"
    timeout 240 python3 -m ornith_stack bench --url "http://127.0.0.1:$PORT" --model "$MODEL_NAME" \
        --out "$1/bench" --max-tokens 256 --samples 5 --prompt-lengths 512,2048,3500 \
        --concurrency 1,8,32 --task-limit 5 --task-max-tokens 128 > "$1/bench.log" 2>&1
    log "bench exit $?"; tail -n 40 "$1/bench.log"
}

key_lines() {  # the engine log lines a planner is checked against, and the speculative-decoding summary
    grep -E "Setting attention block size|GPU KV cache size|Maximum concurrency|Available KV cache memory|\
Padding mamba page size|Loading weights took|Model loading took|init engine|Graph capturing finished|\
SpecDecoding metrics|Avg prompt throughput|mamba_cache_mode|prefix caching|Resolved architecture|\
speculative|non-default args" "$1" | sed -E 's/\x1b\[[0-9;]*m//g' | cut -c1-600
}

serve_one() {  # $1 = mode, $2 = health deadline; returns 0 if it served traffic
    local mode=$1 R="$W/runs/$1"
    rm -rf "$R"; mkdir -p "$R"
    engine_args "$mode"
    printf '%q ' python3 -m vllm.entrypoints.openai.api_server "${ENGINE_ARGS[@]}" > "$R/command.txt"
    log "starting $mode: $(cat "$R/command.txt")"
    setsid python3 -m vllm.entrypoints.openai.api_server "${ENGINE_ARGS[@]}" > "$R/engine.log" 2>&1 &
    EPID=$!
    if ! wait_healthy "$EPID" "$2"; then
        log "$mode did not become healthy (exit or deadline); last lines:"
        tail -n 40 "$R/engine.log" | tee "$R/failure.txt"
        stop_engine
        return 1
    fi
    log "$mode healthy"
    start_exporter "$R"
    python3 "$REPO/tests/gpu/traffic.py" "http://127.0.0.1:$PORT" "$MODEL_NAME" "$R" 2>&1 | tee "$R/traffic.log"
    local rc=${PIPESTATUS[0]}
    if [ -n "${XPID:-}" ]; then
        scrape_exporter "$R/exporter-metrics-after-traffic.txt"
        run_bench "$R"
        scrape_exporter "$R/exporter-metrics.txt"
    fi
    sleep 11  # one more stats-logger interval (10 s) for the SpecDecoding log line
    python3 -c "import urllib.request,sys; open(sys.argv[2],'wb').write(urllib.request.urlopen(sys.argv[1]).read())" \
        "http://127.0.0.1:$PORT/metrics" "$R/metrics-final.txt"
    stop_exporter
    stop_engine
    key_lines "$R/engine.log" > "$R/key-lines.txt"
    log "$mode key lines:"; cat "$R/key-lines.txt"
    python3 - "$R" "$mode" <<'EOF'
import json, sys, pathlib
r, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
s = {"mode": mode, "command": (r / "command.txt").read_text().strip(),
     "key_lines": (r / "key-lines.txt").read_text().splitlines()}
t = r / "traffic.json"
if t.exists():
    s["traffic"] = json.loads(t.read_text())
(r / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
EOF
    return "$rc"
}

collect() {
    local best=$1
    cp "$W/machine.txt" "$W/runs/" 2>/dev/null
    cp "$W/models/target/config.json" "$W/runs/target-config.json" 2>/dev/null
    cp "$W/models/draft/config.json" "$W/runs/draft-config.json" 2>/dev/null
    tar -czf "$OUT/results.tar.gz" -C "$W" runs
    if [ -n "$best" ]; then
        for f in metrics.txt engine.log chat-completion.json summary.json exporter-metrics.txt bench/bench.md; do
            [ -f "$W/runs/$best/$f" ] && cp "$W/runs/$best/$f" "$OUT/$(basename "$f")"
        done
    fi
    ls -la "$OUT"
}

serve() {  # $1 = mode, $2 = optional last carried folder
    local mode=$1 best=""
    [ -n "${2:-}" ] && stage "$2"
    unpack_vllm || exit 1
    [ -f "$W/machine.txt" ] || machine_facts
    make_models || exit 1
    grep -q '^vllm ' "$W/machine.txt" || python3 -c "import vllm, torch, transformers; print('vllm', \
vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -3 >> "$W/machine.txt"
    if [ "$mode" = dflash ] || [ "$mode" = auto ]; then
        if serve_one dflash 420; then best=dflash; else
            log "dflash failed after $(elapsed)s"
        fi
    fi
    # ngram as the fallback only while the call (600 s at most) has room for a start; else next call.
    if [ "$mode" = ngram ] || { [ "$mode" = auto ] && [ -z "$best" ] && [ "$(elapsed)" -lt 240 ]; }; then
        serve_one ngram $(( $(elapsed) + 300 )) && best=ngram
    fi
    # The checks of tests/gpu/test_vllm_h200.py on this machine's runs.
    python3 -m pytest -p no:cacheprovider -q -m gpu "$REPO/tests/gpu" > "$W/runs/pytest-gpu.txt" 2>&1
    tail -n 3 "$W/runs/pytest-gpu.txt"
    collect "$best"
    log "done: best=$best"
}

case ${1:-} in
    stage) stage "$2"; [ -f "$W/site/.deps" ] && { [ -f "$W/machine.txt" ] || machine_facts; make_models; } ;;
    serve) serve "${2:-auto}" "${3:-}" ;;
    *) echo "usage: $0 stage DIR | serve dflash|ngram|auto [DIR]" >&2; exit 2 ;;
esac
