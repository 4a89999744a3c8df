#!/usr/bin/env bash
# GPU validation run of the pinned SGLang 0.5.17 on an H200 machine of two GPUs (issue 14): tp 1 on
# GPU 0 (as the gpu96 profile) and tp 2 on both (as a100x2), from `ornith-stack launch-args`.
#
# The machine has torch 2.11.0+cu130 but no SGLang and no network, receives at most 64 MiB per call and
# stays warm about 30 s between calls. So the payload (made here by tests/gpu/make_sglang_payload.sh into
# the ignored folder .gpu/sglang/) arrives in parts over consecutive calls, kept under $W (/tmp):
#
#   bash tests/gpu/run_sglang_h200.sh stage .gpu/sglang/xfer1     # one call per part, back to back;
#   bash tests/gpu/run_sglang_h200.sh stage .gpu/sglang/xfer2     # the last part (with the manifest)
#   ...                                                           # unpacks, checks the import, makes models
#   bash tests/gpu/run_sglang_h200.sh serve tp1                   # pytest -m gpu -k tp1: starts SGLang
#   bash tests/gpu/run_sglang_h200.sh serve tp2                   # and records into $W/runs/tpN
#   bash tests/gpu/run_sglang_h200.sh serve uncapped-tp1          # tp 1 without the KV / request caps
#   bash tests/gpu/run_sglang_h200.sh gateway                     # two gpu96 replicas at half the memory
#                                                                 # fraction behind the Model Gateway
#   bash tests/gpu/run_sglang_h200.sh fit                         # the computed H200 profile as written, cold
#                                                                 # and warm compile caches, beside uncapped
#   BENCH_PEER_CALL=C BENCH_PEER_LEVELS=1,8,32 BENCH_PEER_ROUNDS=2 \
#   bash tests/gpu/run_sglang_h200.sh bench-peer                  # ours beside sglang.bench_serving, same
#                                                                 # prompts, A B B A; again as D (32,8,1)
#                                                                 # and E (8,32,1); 128,256 as B
#                                                                 # BENCH_PEER_REALSIZE=1: at the 35B's real shapes
#   bash tests/gpu/run_sglang_h200.sh realsize seed000            # the 35B at its real shapes, dummy weights,
#   bash tests/gpu/run_sglang_h200.sh realsize computed           # simulated acceptance (issue 40): seed 000's
#   bash tests/gpu/run_sglang_h200.sh realsize compare            # table, the computed profile, caps vs defaults
#   bash tests/gpu/run_sglang_h200.sh rehearse                    # `ornith-stack rehearse` of the computed 1x H200
#                                                                 # profile as a user runs it (issue 40)
#   bash tests/gpu/run_sglang_h200.sh tune                        # `ornith-stack tune gpu96 --launch local`:
#                                                                 # seed caps, SGLang's defaults, DFlash depth
# A staged folder may also hold wheels (sglang-router for `gateway`, math-verify which the CLI imports);
# they are unpacked into $W/wheels.
#
# The device tool sends the session's own checkout, not a helper's worktree: the recorded runs carried
# this tree as a tarball (`git ls-files -co --exclude-standard | tar -czf .gpu/.../tree.tar.gz -T -`)
# beside the parts, in an ignored folder of that checkout, and unpacked it to /tmp/wt first.
#
# `serve` runs tests/gpu/test_sglang_h200.py's live test, which starts the engine from the profile's
# launch args plus the overrides tests/gpu/sglang_run.py names, records everything, and checks it.
# What comes back ($OUT): results-tpN.tar.gz (the run folder) and the pytest output.
set -uo pipefail

W=${ORNITH_GPU_WORK:-/tmp/ornith-gpu}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$W/out}
START=$(date +%s)
mkdir -p "$W"/{parts,site,models,runs} "$OUT"

# ORNITH_SRC: another copy of the package (a snapshot of a commit) instead of this tree's src/.
export PYTHONPATH="$W/site:$W/wheels:${ORNITH_SRC:-$REPO/src}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_DISABLE_REQUEST_LOGGING=1
# NVLink multicast stays off on these machines (shared GPUs); SGLang's own processes inherit it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ORNITH_GPU_WORK=$W

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*"; }

unpack() {
    [ -f "$W/site/.sglang-payload" ] && return 0
    [ -f "$W/parts/manifest.sha256" ] || return 0
    (cd "$W/parts" && sha256sum -c --quiet manifest.sha256) || { log "parts incomplete or corrupt"; return 1; }
    cat "$W"/parts/sglang.tar.xz.part-* | xz -dc -T0 | tar -x -C "$W/site" || return 1
    rm -f "$W"/parts/sglang.tar.xz.part-*
    log "unpacked: $(du -sh "$W/site" | cut -f1)"
}

machine_facts() {
    {
        date -u +%Y-%m-%dT%H:%M:%SZ
        nvidia-smi
        uname -r
        python3 -V
        python3 -m pip list 2>/dev/null | grep -i -E '^(torch|triton|transformers|tokenizers|numpy|huggingface.hub|safetensors|prometheus.client|cuda.bindings) '
        python3 -c "import sglang, transformers, torch; print('sglang', sglang.__version__, 'transformers', \
transformers.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
    } > "$W/machine.txt" 2>&1
    cat "$W/machine.txt"
}

import_check() {  # what the server imports at start, before any GPU time is spent on a launch
    python3 -c "import sglang.srt.entrypoints.http_server, sgl_kernel, flashinfer; print('import ok')" 2>&1 | tail -n 15
}

make_models() {
    [ -f "$W/models/.done" ] && return 0
    python3 -m ornith_stack tiny-model "$W/models/target" --with-vision || return 1
    python3 "$REPO/tests/gpu/make_dflash_draft.py" "$W/models/target" "$W/models/draft" --agree || return 1
    touch "$W/models/.done"
    log "models: $(du -sh "$W/models/target" "$W/models/draft" | tr '\n' ' ')"
}

stage() {  # copy one carried folder of parts; the last one unpacks and prepares
    local f
    for f in "$1"/*; do
        case $f in
            *.whl) mkdir -p "$W/wheels" && python3 -m zipfile -e "$f" "$W/wheels" ;;
            *) cp "$f" "$W/parts/" ;;
        esac
    done
    log "staged $(cd "$1" && printf '%s ' *)"
    unpack || exit 1
    if [ -f "$W/site/.sglang-payload" ]; then
        [ -f "$W/machine.txt" ] || machine_facts
        import_check
        make_models || exit 1
    fi
}

serve() {  # $1 = tp1 | tp2
    local run=$1
    if [ ! -f "$W/site/.sglang-payload" ] || [ ! -f "$W/models/.done" ]; then log "not staged"; exit 1; fi
    case $run in *tp1) export CUDA_VISIBLE_DEVICES=0 ;; *) export CUDA_VISIBLE_DEVICES=0,1 ;; esac
    log "pytest -m gpu -k live-$run (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)"
    python3 -m pytest -p no:cacheprovider -q -m gpu -k "live-$run" "$REPO/tests/gpu/test_sglang_h200.py" \
        2>&1 | tee "$W/runs/pytest-gpu-$run.txt"
    local rc=${PIPESTATUS[0]}
    cp "$W/machine.txt" "$W/models/target/config.json" "$W/runs/" 2>/dev/null
    cp "$W/models/draft/config.json" "$W/runs/draft-config.json" 2>/dev/null
    nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv > "$W/runs/nvidia-smi-after-$run.csv"
    tar -czf "$OUT/results-$run.tar.gz" -C "$W/runs" .
    tail -n 30 "$W/runs/$run/engine.log" 2>/dev/null | cut -c1-300
    log "$run done: pytest rc=$rc"
    return "$rc"
}

gateway() {  # tests/gpu/gateway_run.py on GPU 0: two replicas, the gateway, the exporter, the bench
    if [ ! -f "$W/site/.sglang-payload" ] || [ ! -f "$W/models/.done" ]; then log "not staged"; exit 1; fi
    export CUDA_VISIBLE_DEVICES=0
    log "gateway_run.py (two gpu96 replicas on GPU 0)"
    timeout "${GATEWAY_TIMEOUT_S:-480}" python3 "$REPO/tests/gpu/gateway_run.py" "$W/runs/gateway" --target "$W/models/target" \
        --draft "$W/models/draft" 2>&1 | tee "$W/runs/gateway-run.txt"
    local rc=${PIPESTATUS[0]}
    cp "$W/machine.txt" "$W/runs/" 2>/dev/null
    nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv > "$W/runs/nvidia-smi-after-gateway.csv"
    tar -czf "$OUT/results-gateway.tar.gz" -C "$W/runs" gateway gateway-run.txt machine.txt nvidia-smi-after-gateway.csv
    tail -n 20 "$W/runs/gateway/replica-1/engine.log" 2>/dev/null | cut -c1-300
    log "gateway done: rc=$rc"
    return "$rc"
}

fit() {  # tests/gpu/fit_run.py on GPU 0: the computed H200 profile as written, cold and warm, and uncapped (issue 30)
    if [ ! -f "$W/site/.sglang-payload" ] || [ ! -f "$W/models/.done" ]; then log "not staged"; exit 1; fi
    export CUDA_VISIBLE_DEVICES=0
    log "fit_run.py (profiles new fit-h200 --gpu h200 --count 1; cold, warm, uncapped)"
    timeout "${FIT_TIMEOUT_S:-585}" python3 "$REPO/tests/gpu/fit_run.py" "$W/runs/fit" --target "$W/models/target" \
        --draft "$W/models/draft" ${FIT_ALTERNATE:+--alternate "$FIT_ALTERNATE"} 2>&1 | tee -a "$W/runs/fit-run.txt"
    local rc=${PIPESTATUS[0]}
    cp "$W/machine.txt" "$W/runs/" 2>/dev/null
    tar -czf "$OUT/results-fit.tar.gz" -C "$W/runs" --exclude fit/compile-cache fit fit-run.txt machine.txt
    log "fit done: rc=$rc"
    return "$rc"
}

bench_peer() {  # tests/gpu/bench_peer_run.py on GPU 0: one uncapped gpu96 engine, both benches in turn (issue 32)
    # BENCH_PEER_CALL names this call's part (A, B, ...): its levels (BENCH_PEER_LEVELS), rounds of A B B A
    # (BENCH_PEER_ROUNDS) and, with BENCH_PEER_CANARY=1, the canary and aborted requests afterwards (issue 33).
    if [ ! -f "$W/site/.sglang-payload" ] || [ ! -f "$W/models/.done" ]; then log "not staged"; exit 1; fi
    export CUDA_VISIBLE_DEVICES=0
    local part=${BENCH_PEER_CALL:-A} target=$W/models/target draft=$W/models/draft realsize=()
    if [ -n "${BENCH_PEER_REALSIZE:-}" ]; then  # issue 40: the 35B's real shapes, dummy weights, acceptance 6.1
        [ -f "$W/models/real-target/config.json" ] || python3 "$REPO/tests/gpu/realsize_run.py" shapes "$W/models" || exit 1
        target=$W/models/real-target draft=$W/models/real-draft realsize=(--realsize)
    fi
    log "bench_peer_run.py part $part: levels ${BENCH_PEER_LEVELS:-1,8,32,128,256}, ${BENCH_PEER_ROUNDS:-1} round(s)"
    timeout "${BENCH_PEER_TIMEOUT_S:-590}" python3 "$REPO/tests/gpu/bench_peer_run.py" "$W/runs/bench-peer-$part" \
        --target "$target" --draft "$draft" "${realsize[@]}" --compile-cache "$W/compile-cache" \
        --levels "${BENCH_PEER_LEVELS:-1,8,32,128,256}" --rounds "${BENCH_PEER_ROUNDS:-1}" \
        ${BENCH_PEER_CANARY:+--record-canary} ${BENCH_PEER_NEW_CONNECTIONS:+--connection-per-request} 2>&1 | tee "$W/runs/bench-peer-run-$part.txt"
    local rc=${PIPESTATUS[0]}
    cp "$W/machine.txt" "$W/runs/" 2>/dev/null
    tar -czf "$OUT/results-bench-peer-$part.tar.gz" -C "$W/runs" --exclude 'ours-*.jsonl' --exclude 'sglang-*.json' \
        "bench-peer-$part" "bench-peer-run-$part.txt" machine.txt
    log "bench-peer $part done: rc=$rc"
    return "$rc"
}

tune() {  # `ornith-stack tune gpu96 --launch local` on GPU 0, within the device's 10-minute call (issue 32)
    if [ ! -f "$W/site/.sglang-payload" ] || [ ! -f "$W/models/.done" ]; then log "not staged"; exit 1; fi
    export CUDA_VISIBLE_DEVICES=0
    # The candidates: the seed (4 running requests, 40,960 KV tokens, DFlash block 16), SGLang's own defaults (both
    # caps removed), then the DFlash block 8 and speculation off from the better of those two. The --set flags are
    # sglang_run.py's common overrides for the tiny model, plus no prefill CUDA graphs (80 of the 150 s start-up).
    # The compile caches of the bench-peer calls (same kernels, same folder): candidates start warmer.
    eval "$(python3 -c "import sys; sys.path.insert(0, '$REPO/tests/gpu'); from fit_run import cache_env; from pathlib import Path
print(' '.join(f'export {k}={v}' for k, v in cache_env(Path('$W/compile-cache')).items()))")"
    # TUNE_RESUME_FROM: a recorded tune's folder (its tune-state.json) to resume from on a fresh machine: the
    # candidates it measured are not measured again, the budget counts their time.
    if [ -n "${TUNE_RESUME_FROM:-}" ]; then
        mkdir -p "$W/runs/tune" && cp -r --update=none "$REPO/$TUNE_RESUME_FROM"/. "$W/runs/tune/"
        log "resuming from $TUNE_RESUME_FROM: $(grep -c '"key"' "$W/runs/tune/tune-state.json") candidates measured"
    fi
    # TUNE_REALSIZE=1 (issue 40): the 35B at its real shapes without weights (realsize_run.py's folders, --load-format
    # dummy) with DFlash's acceptance simulated at TUNE_ACCEPTANCE (6.1, seed 000's GSM8K), from the profile
    # `profiles new h200x1 --gpu h200 --count 1` writes; speculation off and block 8 against the profile's block 16.
    local profile=gpu96 models=$W/models/target draft=$W/models/draft extra=() slo='ttft_p99:500 tpot_p99:20'
    local rates=8,32,128,inf spec_try='spec-block=off,8'
    local tries=(--try max-running-requests=default --try max-total-tokens=default --try "$spec_try")
    if [ -n "${TUNE_REALSIZE:-}" ]; then
        [ -f "$W/models/real-target/config.json" ] || python3 "$REPO/tests/gpu/realsize_run.py" shapes "$W/models" || exit 1
        export ORNITH_PROFILE_DIR=$W/runs/tune-profiles SGLANG_SIMULATE_ACC_LEN=${TUNE_ACCEPTANCE:-6.1}
        python3 -m ornith_stack profiles new h200x1 --gpu h200 --count 1 --out "$W/runs/tune-rendered" >/dev/null || exit 1
        profile=h200x1 models=$W/models/real-target draft=$W/models/real-draft extra=(--set serve.args.load-format=dummy)
        tries=(--try "$spec_try") slo=${TUNE_SLO:-'ttft_p99:1000 tpot_p99:25'} rates=${TUNE_RATES:-4,16,64,inf}
    fi
    log "tune $profile (budget ${TUNE_BUDGET_MIN:-7} min)"
    timeout 560 python3 -m ornith_stack tune "$profile" --launch local \
        --set "model.repo=$models" --set "draft.repo=$draft" "${extra[@]}" \
        --set serve.args.attention-backend=triton --set serve.args.sampling-backend=pytorch \
        --set serve.args.grammar-backend=none --set serve.args.disable-prefill-cuda-graph=true \
        --slo "$slo" --workload random:256:128 --rates "$rates" --num-prompts 64 \
        --warmup 1 "${tries[@]}" --max-candidates 4 --budget "${TUNE_BUDGET_MIN:-7}" --start-timeout 300 \
        --name "$profile-tuned" --out "$W/runs/tune" 2>&1 | tee "$W/runs/tune-run.txt"
    local rc=${PIPESTATUS[0]}
    cp -r "${ORNITH_PROFILE_DIR:-$HOME/.config/ornith-stack/profiles}" "$W/runs/tune/profiles" 2>/dev/null
    tar -czf "$OUT/results-tune.tar.gz" -C "$W/runs" tune tune-run.txt
    log "tune done: rc=$rc"
    return "$rc"
}

realsize() {  # tests/gpu/realsize_run.py PART on GPU 0: the 35B at its real shapes, dummy weights (issue 40)
    if [ ! -f "$W/site/.sglang-payload" ] || [ ! -f "$W/models/.done" ]; then log "not staged"; exit 1; fi
    export CUDA_VISIBLE_DEVICES=0
    local part=$1
    [ -f "$W/models/real-target/config.json" ] || python3 "$REPO/tests/gpu/realsize_run.py" shapes "$W/models" || exit 1
    log "realsize_run.py $part (Ornith-1.5-35B-A3B real shapes, --load-format dummy)"
    timeout "${REALSIZE_TIMEOUT_S:-585}" python3 "$REPO/tests/gpu/realsize_run.py" "$part" "$W/runs/realsize-$part" \
        --models "$W/models" --compile-cache "$W/compile-cache" ${REALSIZE_LEVELS:+--levels "$REALSIZE_LEVELS"} \
        2>&1 | tee "$W/runs/realsize-$part-run.txt"
    local rc=${PIPESTATUS[0]}
    cp "$W/machine.txt" "$W/runs/" 2>/dev/null
    nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv > "$W/runs/nvidia-smi-after-$part.csv"
    tar -czf "$OUT/results-realsize-$part.tar.gz" -C "$W/runs" --exclude compile-cache --exclude 'profiles' \
        "realsize-$part" "realsize-$part-run.txt" machine.txt "nvidia-smi-after-$part.csv"
    log "realsize $part done: rc=$rc"
    return "$rc"
}

rehearse_gpu() {  # `ornith-stack rehearse` on GPU 0 (issue 40): the profile `profiles new` writes for this card
    # (REHEARSE_GPU: h200, or h100-sxm on one H100), at the shipped real shapes, acceptance simulated.
    if [ ! -f "$W/site/.sglang-payload" ]; then log "not staged"; exit 1; fi
    export CUDA_VISIBLE_DEVICES=0 ORNITH_PROFILE_DIR=$W/runs/rehearse-profiles
    mkdir -p "$ORNITH_PROFILE_DIR" "$W/runs/rehearse"
    eval "$(python3 -c "import sys; sys.path.insert(0, '$REPO/tests/gpu'); from fit_run import cache_env; from pathlib import Path
print(' '.join(f'export {k}={v}' for k, v in cache_env(Path('$W/compile-cache')).items()))")"
    # REHEARSE_PROFILE: a shipped profile as it is (gpu96 on one H100: where SGLang stops), else the computed one.
    local gpu=${REHEARSE_GPU:-h200} name=${REHEARSE_PROFILE:-rehearse-${REHEARSE_GPU:-h200}x1}
    if [ -z "${REHEARSE_PROFILE:-}" ]; then
        python3 -m ornith_stack profiles new "$name" --gpu "$gpu" --count 1 --out "$W/runs/rehearse-rendered" \
            2>&1 | tee "$W/runs/rehearse-run.txt" || exit 1
    fi
    # The same engine overrides as every recording here (sglang_run.py): no FA3 kernels carried.
    log "ornith-stack rehearse $name --acceptance ${REHEARSE_ACCEPTANCE:-6.1}"
    timeout "${REHEARSE_TIMEOUT_S:-570}" python3 -m ornith_stack rehearse "$name" \
        --acceptance "${REHEARSE_ACCEPTANCE:-6.1}" --set serve.args.attention-backend=triton \
        --set serve.args.sampling-backend=pytorch --set serve.args.grammar-backend=none \
        --start-timeout 420 --out "$W/runs/rehearse" 2>&1 | tee -a "$W/runs/rehearse-run.txt"
    local rc=${PIPESTATUS[0]}
    python3 -m ornith_stack plan "$name" --json > "$W/runs/rehearse/plan-here.json" 2>&1
    cp "$W/machine.txt" "$W/runs/" 2>/dev/null
    cp -r "$ORNITH_PROFILE_DIR" "$W/runs/rehearse/profiles" 2>/dev/null
    tar -czf "$OUT/results-rehearse-$name.tar.gz" -C "$W/runs" --exclude 'tokenizer.json' rehearse rehearse-run.txt machine.txt
    tail -n 20 "$W/runs/rehearse/engine/engine.log" 2>/dev/null | cut -c1-300
    log "rehearse done: rc=$rc"
    return "$rc"
}

case ${1:-} in
    rehearse) rehearse_gpu ;;
    stage) stage "$2" ;;
    serve) serve "$2" ;;
    gateway) gateway ;;
    bench-peer) bench_peer ;;
    fit) fit ;;
    tune) tune ;;
    realsize) realsize "$2" ;;
    *) echo "usage: $0 stage DIR | serve tp1|tp2|uncapped-tp1 | gateway | bench-peer | fit | tune | rehearse | realsize seed000|computed|compare|refusal" >&2; exit 2 ;;
esac
