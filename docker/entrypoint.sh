#!/usr/bin/env bash
# Container entrypoint of the ornith-stack engine images: check, then exec the engine.
#
#   1. $ORNITH_PROFILE must name a shipped profile (else: refuse, exit 2, with the known names).
#   2. `ornith-stack doctor --profile $ORNITH_PROFILE [--weights $ORNITH_WEIGHTS]` must say ready
#      (else: refuse, exit 1, after the doctor's FAIL lines). Operator overrides:
#        ORNITH_DOCTOR_WARN_ONLY=1   run the doctor, print its problems, start anyway
#        ORNITH_SKIP_DOCTOR=1        do not run the doctor
#   3. exec the command (compose's `command:` is `ornith-stack launch-args $ORNITH_PROFILE`; with no
#      command the entrypoint asks launch-args itself) with the words of $ORNITH_EXTRA_ARGS appended
#      (shell-quoted, e.g. ORNITH_EXTRA_ARGS='--max-num-seqs 8 --served-model-name "my model"').
#      ORNITH_DRY_RUN=1 prints that argv as one JSON list instead of executing it.
#   4. ORNITH_API_KEY set: the engine adapter says how the engine takes it (`ornith-stack engine-key`:
#      vLLM reads $VLLM_API_KEY, SGLang a 0600 `--config` YAML file), so the key is never on the command
#      line; ORNITH_API_KEY itself is removed from the engine's environment, and every line the engine
#      prints passes a filter that replaces the key with <redacted> (SGLang logs its server_args, key
#      included, at start).
#   The log line before exec shows the argv with secrets (--api-key VALUE..., hf_... tokens) redacted;
#   better still, pass secrets in the environment (ORNITH_API_KEY, HF_TOKEN) rather than as flags.
set -euo pipefail

say() { printf 'ornith-entrypoint: %s\n' "$*" >&2; }
# The argv as one shell-quoted line for the log, with secrets replaced by <redacted>: the value of a
# secret flag (--api-key, --admin-api-key, --hf-token, --*-token, --*-secret, --*-password; every word after
# it up to the next flag, or after "="), and anything shaped like a Hugging Face token (hf_...).
redacted() {
  python3 - "$@" <<'PY'
import re, shlex, sys
SECRET_FLAG = re.compile(r"--?(?:[\w-]*-)?(?:api-keys?|token|secret|password|passwd)", re.IGNORECASE)
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
out, hide_next = [], False
for word in sys.argv[1:]:
    flag, eq, _ = word.partition("=")
    # vLLM's --api-key takes several keys (`--api-key a b`): hide every value up to the next flag.
    if hide_next and not word.startswith("-"):
        out.append("<redacted>")
        continue
    hide_next = False
    if SECRET_FLAG.fullmatch(flag):
        out.append(f"{flag}=<redacted>" if eq else word)
        hide_next = not eq
    else:
        out.append(HF_TOKEN.sub("<redacted>", word))
print(shlex.join(out))
PY
}
is_on() { case "${1:-}" in 1|true|yes|on) return 0 ;; *) return 1 ;; esac; }

profile="${ORNITH_PROFILE:-}"
if [[ -z $profile ]]; then
  say "refusing to start: ORNITH_PROFILE is not set (\`ornith-stack profiles\` lists the profiles)"
  exit 2
fi
# An unknown profile is refused whatever the overrides say: nothing sensible could start.
if ! check=$(ornith-stack profiles show "$profile" 2>&1 >/dev/null); then
  say "refusing to start: ${check#error: }"
  exit 2
fi

if is_on "${ORNITH_SKIP_DOCTOR:-}"; then
  say "ORNITH_SKIP_DOCTOR is set: not running the doctor"
else
  doctor=(ornith-stack doctor --profile "$profile")
  [[ -n ${ORNITH_WEIGHTS:-} ]] && doctor+=(--weights "$ORNITH_WEIGHTS")
  is_on "${ORNITH_DOCTOR_WARN_ONLY:-}" && doctor+=(--warn-only)
  status=0
  "${doctor[@]}" >&2 || status=$?
  if ((status != 0)); then
    say "refusing to start: 'ornith-stack doctor --profile $profile' found the problems above (exit $status)." \
        "Fix them, or set ORNITH_DOCTOR_WARN_ONLY=1 to start anyway (ORNITH_SKIP_DOCTOR=1 skips the check)."
    exit "$status"
  fi
fi

if (($# == 0)); then
  # No command: the profile's own engine command line.
  mapfile -t cmd < <(ornith-stack launch-args "$profile" --json \
    | python3 -c 'import json, sys; print(*json.load(sys.stdin), sep="\n")')
  set -- "${cmd[@]}"
fi
if [[ -n ${ORNITH_EXTRA_ARGS:-} ]]; then
  # Split like a shell would (quotes respected), without evaluating anything.
  if ! python3 -c 'import shlex, sys; shlex.split(sys.argv[1])' "$ORNITH_EXTRA_ARGS" 2>/dev/null; then
    # Not echoed: it may carry a secret (--api-key).
    say "refusing to start: ORNITH_EXTRA_ARGS has unbalanced quotes (check its ' and \" pairs)"
    exit 2
  fi
  mapfile -d '' -t extra < <(python3 -c \
    'import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))' "$ORNITH_EXTRA_ARGS")
  set -- "$@" "${extra[@]}"
fi

# HF_HUB_OFFLINE unset or empty: go offline when every Hub model the command names (--model,
# --model-path, `serve MODEL`, the draft, at their --revision) is already in the Hugging Face cache, so that
# a restart loads exactly what the first start downloaded and never re-resolves `main` against the Hub.
# HF_HUB_OFFLINE=0 keeps the Hub; 1 is always offline (Ansible sets it after downloading the pinned revision).
if [[ -z ${HF_HUB_OFFLINE:-} ]] && cached=$(python3 - "$@" 2>/dev/null <<'PY'
import json, os, sys
from huggingface_hub import try_to_load_from_cache

argv = sys.argv[1:]
value = {w: argv[i + 1] for i, w in enumerate(argv[:-1]) if w.startswith("--")}
models = [(value.get("--model") or value.get("--model-path") or
           (argv[argv.index("serve") + 1] if "serve" in argv[:-1] else None), value.get("--revision"))]
models.append((value.get("--speculative-draft-model-path"), value.get("--speculative-draft-model-revision")))
spec = json.loads(value.get("--speculative-config", "{}") or "{}")
models.append((spec.get("model"), spec.get("revision")))
repos = [(m, r or "main") for m, r in models if m and not m.startswith(("/", ".")) and not os.path.exists(m)
         and m.count("/") == 1]
if not repos or not all(isinstance(try_to_load_from_cache(m, "config.json", revision=r), str) for m, r in repos):
    sys.exit(1)
print(" ".join(f"{m}@{r}" for m, r in repos))
PY
); then
  export HF_HUB_OFFLINE=1
  say "$cached already in the Hugging Face cache: HF_HUB_OFFLINE=1 (set HF_HUB_OFFLINE=0 to re-resolve on the Hub)"
fi

# The API key: handed over the engine's own way, never as a flag (see 4. above).
key_file=""
if [[ -n ${ORNITH_API_KEY:-} ]]; then
  key_dir=$(mktemp -d "${TMPDIR:-/tmp}/ornith-key.XXXXXX")  # mode 0700
  key_file="$key_dir/key"
  (umask 077 && printf '%s' "$ORNITH_API_KEY" > "$key_file")
  handoff=$(ornith-stack engine-key "$profile" --dir "$key_dir")
  # Line 1: the environment variables that carry the key; then one argv word per line.
  mapfile -t words < <(python3 -c 'import json, sys; h = json.loads(sys.argv[1])
print(" ".join(h["env"])); print(*h["args"], sep="\n")' "$handoff")
  for name in ${words[0]}; do export "$name=$ORNITH_API_KEY"; done
  for word in "${words[@]:1}"; do [[ -n $word ]] && set -- "$@" "$word"; done
  unset ORNITH_API_KEY
fi
# Copies stdin to stdout with the key (read from $1) replaced by <redacted>, line by line as it comes.
redact_key() {
  python3 -u -c 'import sys
key = open(sys.argv[1], "rb").read()
out = sys.stdout.buffer
for line in iter(sys.stdin.buffer.readline, b""):
    out.write(line.replace(key, b"<redacted>") if key else line)
    out.flush()' "$1"
}

if is_on "${ORNITH_DRY_RUN:-}"; then
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
  exit 0
fi
say "profile $profile: exec $(redacted "$@")"
if [[ -n $key_file ]]; then
  # The engine stays the process that exec replaces this shell with (PID 1 in a container, so it gets
  # the stop signal); its output goes through two filters, which end when it closes its side.
  exec "$@" > >(redact_key "$key_file") 2> >(redact_key "$key_file" >&2)
fi
exec "$@"
