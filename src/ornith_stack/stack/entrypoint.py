"""The engine images' entrypoint (`ornith-stack entrypoint [COMMAND...]`): check, then start the engine.

1. $ORNITH_PROFILE must name a profile (else: refuse, exit 2, with the known names), whatever else is set.
2. The doctor must find the machine ready (else: refuse, exit 1, after its FAIL lines). Operator overrides:
   ORNITH_DOCTOR_WARN_ONLY=1 runs it and starts anyway; ORNITH_SKIP_DOCTOR=1 does not run it.
3. The command (none: the profile's launch args) with the words of $ORNITH_EXTRA_ARGS appended, split as a
   shell would without evaluating anything. ORNITH_DRY_RUN=1 prints the argv as a JSON list instead.
4. HF_HUB_OFFLINE unset or empty: offline once every Hub model the command names is in the Hugging Face
   cache, so a restart loads what the first start downloaded and never re-resolves `main` on the Hub.
5. $ORNITH_API_KEY set: the engine adapter hands it over the engine's own way (vLLM: $VLLM_API_KEY and a
   middleware that asks for it on every route but health and metrics; SGLang: a 0600 config file it is pointed
   at), never as a flag; ORNITH_API_KEY leaves the engine's environment, and the engine runs under a supervisor
   that redacts the key from its output (stack/supervise.py). $ORNITH_OPERATOR_KEY, the operator's credential,
   goes the same way to the routes that change the engine (SGLang's admin routes: `admin-api-key` in that
   file). The key file is removed when the engine exits. Without a key the engine replaces this process (exec).
The log line before the start, and a dry run's argv, show the argv with secrets redacted.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ornith_stack.engines import adapter_for, launch_args, models_named, shell_join
from ornith_stack.errors import UserError
from ornith_stack.profiles import Profile, load_profile
from ornith_stack.stack.envfile import KEY_VAR, OPERATOR_VAR, check_key
from ornith_stack.stack.keycheck import refusal

ON = ("1", "true", "yes", "on")
# The value of a secret flag (--api-key, --admin-api-key, --hf-token, --*-token, --*-secret, --*-password), in
# every spelling the engines accept (vLLM's argparse takes --api_key and --hf_token too): every word after it
# up to the next flag (vLLM's `--api-key a b` takes several), or after "=".
_SECRET_FLAG = re.compile(r"--?(?:[\w-]*[-_])?(?:api[-_]keys?|token|secret|password|passwd)", re.IGNORECASE)
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")


def say(message: str) -> None:
    print(f"ornith-entrypoint: {message}", file=sys.stderr, flush=True)


def is_on(value: str | None) -> bool:
    return (value or "").strip().lower() in ON


@dataclass
class Launch:
    """What to start: the argv, its environment, the keys its output must not show (none: no key) and the
    private folder of the files that hand them over (removed when the engine exits)."""

    argv: list[str]
    env: dict[str, str]
    keys: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    key_dir: Path | None = None  # the private folder of a key file the engine reads

    def discard(self) -> None:
        """Remove what prepare() wrote (a dry run starts nothing, so it leaves no key file behind)."""
        if self.key_dir is not None:
            shutil.rmtree(self.key_dir, ignore_errors=True)


def redacted(argv: list[str]) -> str:
    """The argv as one shell-quoted line for the log, secrets replaced by <redacted>."""
    return shell_join(redacted_words(argv))


def redacted_words(argv: list[str]) -> list[str]:
    """The argv with secrets replaced by <redacted> (what a log or a dry run may show)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        flag, eq, _ = word.partition("=")
        if hide_next and not word.startswith("-"):
            out.append("<redacted>")
            continue
        hide_next = False
        if _SECRET_FLAG.fullmatch(flag):
            out.append(f"{flag}=<redacted>" if eq else word)
            hide_next = not eq
        else:
            out.append(_HF_TOKEN.sub("<redacted>", word))
    return out


def profile_of(environ: Mapping[str, str]) -> Profile:
    name = environ.get("ORNITH_PROFILE", "")
    if not name:
        raise UserError("refusing to start: ORNITH_PROFILE is not set (`ornith-stack profiles` lists the profiles)")
    try:
        return load_profile(name)
    except UserError as exc:
        raise UserError(f"refusing to start: {exc}") from None


def command(profile: Profile, argv: list[str], environ: Mapping[str, str]) -> list[str]:
    """The engine's argv: `argv` (none: the profile's launch args) with $ORNITH_EXTRA_ARGS appended."""
    words = list(argv) or launch_args(profile)
    extra = environ.get("ORNITH_EXTRA_ARGS", "")
    try:
        return words + shlex.split(extra)
    except ValueError:
        # Not echoed: it may carry a secret (--api-key).
        raise UserError("refusing to start: ORNITH_EXTRA_ARGS has unbalanced quotes (check its ' and \" pairs)") \
            from None


def check_input(profile: Profile, argv: list[str], environ: Mapping[str, str]) -> None:
    """What prepare() reads of the user's (ORNITH_EXTRA_ARGS, ORNITH_API_KEY, ORNITH_OPERATOR_KEY, and
    ORNITH_BIND where compose publishes the engine), checked before the doctor runs: a refusal is one error
    line, after nothing else."""
    command(profile, argv, environ)
    problem = refusal(environ)  # compose's api-key-check, which the engines do not wait for
    if problem:
        raise UserError(f"refusing to start: {problem}")


def cached_models(argv: list[str]) -> list[str] | None:
    """`repo@revision` of every Hub model `argv` names (the model and the draft, as the engine adapters read
    them), when all are in the Hugging Face cache at their revision; None when one is not (or none is named)."""
    from huggingface_hub import try_to_load_from_cache

    repos = [(m, r or "main") for m, r in dict.fromkeys(models_named(argv))
             if isinstance(m, str) and m and not m.startswith(("/", ".")) and not os.path.exists(m)
             and m.count("/") == 1]
    if not repos or not all(isinstance(try_to_load_from_cache(m, "config.json", revision=r), str) for m, r in repos):
        return None
    return [f"{m}@{r}" for m, r in repos]


def prepare(profile: Profile, argv: list[str], environ: Mapping[str, str]) -> Launch:
    """Steps 3-5 above: the argv and environment to start, without starting anything."""
    launch = Launch(command(profile, argv, environ), dict(environ))
    if not environ.get("HF_HUB_OFFLINE"):
        try:
            cached = cached_models(launch.argv)
        except Exception:  # an unreadable cache is the Hub's business, as it was before the check
            cached = None
        if cached:
            launch.env["HF_HUB_OFFLINE"] = "1"
            launch.notes.append(f"{' '.join(cached)} already in the Hugging Face cache: HF_HUB_OFFLINE=1 "
                                "(set HF_HUB_OFFLINE=0 to re-resolve on the Hub)")
    key = check_key(launch.env.pop(KEY_VAR, ""))
    operator = check_key(launch.env.pop(OPERATOR_VAR, ""), f"${OPERATOR_VAR}")
    if operator and operator == key:
        raise UserError(f"refusing to start: ${OPERATOR_VAR} equals ${KEY_VAR}: the users' key would unlock the "
                        "engine's admin routes (give the operator a credential of its own)")
    if key or operator:
        # Private (0700) and kept while the engine runs (SGLang reads its key file at start); removed after.
        launch.key_dir = Path(tempfile.mkdtemp(prefix="ornith-key."))
        handoff = adapter_for(profile).api_key_handoff(key, launch.key_dir, operator)
        launch.env.update(dict.fromkeys(handoff.env, key))
        launch.argv += handoff.args
        launch.keys = [k for k in (key, operator) if k]
    return launch


def run(launch: Launch, profile: Profile) -> int:
    """Start the engine: exec without a key; with one, under the redacting supervisor (its exit status)."""
    for note in launch.notes:
        say(note)
    say(f"profile {profile.name}: {'run' if launch.keys else 'exec'} {redacted(launch.argv)}")
    if not launch.keys:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvpe(launch.argv[0], launch.argv, launch.env)
        except OSError as exc:
            say(f"cannot start {launch.argv[0]}: {exc.strerror}")
            return 127 if isinstance(exc, FileNotFoundError) else 126
    from ornith_stack.stack.supervise import supervise

    try:
        return supervise(launch.argv, launch.env, launch.keys)
    finally:
        launch.discard()
