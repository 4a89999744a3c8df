"""Alert rules with their guards, per-profile thresholds and runbooks (one Markdown file per alert).

Guards, so that an alert means something is wrong: the engine-down alerts page only for an engine that
was up before (a model load of 7 to 15 minutes is `OrnithEngineStarting`, severity info, which pages
nobody and inhibits the canary and engine alerts of its target in Alertmanager) or that stays down
longer than any model load; the canary-failing alert needs the engine up; the acceptance alert needs a
minimum rate of verification steps (the canary alone, a few short requests a minute, does not qualify)
and a longer `for`. TTFT thresholds come from the profile's published sweep (spark's 262K context takes
122 s to its first token); profiles without a sweep use the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack import deployment as D
from ornith_stack.exporter import catalogue as C
from ornith_stack.generate.core import GeneratedFile, with_header
from ornith_stack.profiles import Profile, load_all

RUNBOOK_DIR = "monitoring/runbooks"
# runbook_url of every alert: this prefix and `<alert>.md`. A path inside the ornith-stack checkout;
# change it here to a published location (a wiki, the repository's web view) and render again.
RUNBOOK_BASE = RUNBOOK_DIR
SOURCE = "src/ornith_stack/generate/alerts.py, the metrics catalogue and the profiles"
TARGET_LABELS = ", ".join(C.TARGET)

# Operating choices, not facts of a seed; monitoring/README.md and each runbook state them.
ACCEPTANCE_FRACTION = 0.6  # alert below 60% of the profile's lowest published acceptance length
MIN_VERIFY_STEPS_PER_S = 5.0  # the 30 s canary makes about 1.3 steps/s at acceptance 2; one user stream 10+
TTFT_P95_DEFAULT_S = 10.0  # profiles without a published TTFT sweep (a 40K-token pool)
TTFT_SWEEP_FACTOR = 1.5  # alert above 1.5x the profile's slowest published TTFT (its longest prompt)
KV_CACHE_FULL_RATIO = 0.95
MAMBA_SLOTS_FULL_RATIO = 0.95
QUEUE_BACKLOG_REQUESTS = 5
WAS_UP_WINDOW = "30m"  # an engine up within this window and down now "died"; otherwise it is starting
STARTUP_GRACE = "20m"  # longer than the slowest model load (15 minutes): down this long pages anyway
CANARY_STALE_S = 300  # 10 canary intervals of 30 s

# Recording rules the alerts read (monitoring/prometheus/rules/ornith-recording.yml); names in the catalogue.
ACCEPTANCE_5M = C.SPEC_ACCEPTANCE_LENGTH.name
VERIFY_STEPS_5M = C.SPEC_VERIFY_STEPS_PER_SECOND.name
EXPECTED_ACCEPTANCE, TTFT_THRESHOLD, TTFT_P95 = C.EXPECTED_ACCEPTANCE, C.TTFT_THRESHOLD, C.TTFT_P95.name


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str  # critical pages, warning notifies, info is routed nowhere (an inhibition source)
    summary: str
    description: str
    check: tuple[str, ...]  # runbook: what to look at, in order
    fix: tuple[str, ...]  # runbook: what usually fixes it

    @property
    def runbook(self) -> str:
        return f"{RUNBOOK_BASE}/{self.name}.md"

    def rule(self) -> dict[str, Any]:
        return {"alert": self.name, "expr": self.expr, "for": self.duration, "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary, "description": self.description,
                                "runbook_url": self.runbook}}


def _was_up(negate: bool = False) -> str:
    up = C.ENGINE_UP.series
    op = "unless" if negate else "and"
    return f"{up} == 0 {op} on ({TARGET_LABELS}) max_over_time({up}[{WAS_UP_WINDOW}]) == 1"


ALERTS: tuple[Alert, ...] = (
    Alert("OrnithExporterDown", f'up{{job="{D.EXPORTER_JOB}"}} == 0', "2m", "critical",
          "The ornith exporter {{ $labels.instance }} is not answering",
          "Prometheus could not scrape the exporter for 2 minutes; no engine metrics arrive, so every other "
          "Ornith alert is blind.",
          ("`docker compose ps exporter` (compose) or `systemctl status ornith-exporter` (host): is it running?",
           "`curl -s http://EXPORTER:9400/metrics | head`: does it answer within the scrape timeout?",
           "Prometheus' Targets page: the scrape error (connection refused, timeout, DNS)."),
          ("Restart the exporter; its logs say why it stopped.",
           "A timeout: raise the scrape timeout or lower the exporter's `--timeout`.")),
    Alert("OrnithEngineDown", _was_up(), "2m", "critical",
          "Engine {{ $labels.target }} was up and is now down",
          f"The exporter could not scrape and parse {{{{ $labels.target }}}}/metrics for 2 minutes after it was up "
          f"within the last {WAS_UP_WINDOW}: the engine died, hangs or answers garbage.",
          ("`ornith_exporter_scrape_errors_total{target=...}`: the reason (timeout, connect, http_status, "
           "not_exposition).",
           "The engine's logs (`docker compose logs engine`, `kubectl logs`): CUDA errors, OOM, NCCL timeouts.",
           "`nvidia-smi`: a GPU fell off the bus or a process holds the memory."),
          ("Restart the engine; a model load takes 7 to 15 minutes (`OrnithEngineStarting` meanwhile).",
           "OOM at start: lower `gpu-memory-utilization` / `mem-fraction-static` in the profile "
           "(`ornith-stack plan`).")),
    Alert("OrnithEngineDownLong", f"{C.ENGINE_UP.series} == 0", STARTUP_GRACE, "critical",
          "Engine {{ $labels.target }} has been down for " + STARTUP_GRACE,
          f"{{{{ $labels.target }}}} has not answered /metrics for {STARTUP_GRACE}: longer than the slowest model "
          "load, so it is not starting, it is stuck or gone.",
          ("The engine's logs: is the model still loading (progress lines), downloading weights, or looping on "
           "an error?", "`ornith-stack doctor`: driver, GPU, weights, ports.",
           "Disk: a full model cache stops a download silently."),
          ("Fix the error the logs show and restart the engine.",
           "A first download of the weights can exceed the grace: pre-fetch them (`model_weights` role).")),
    Alert("OrnithEngineStarting", _was_up(negate=True), "0m", "info",
          "Engine {{ $labels.target }} is starting (not up yet)",
          f"{{{{ $labels.target }}}} has not been up within the last {WAS_UP_WINDOW}: a model load. Pages nobody; "
          "Alertmanager inhibits the target's canary and engine alerts while it lasts.",
          ("Nothing, unless it lasts: after " + STARTUP_GRACE + " `OrnithEngineDownLong` pages.",),
          ("None needed.",)),
    Alert("OrnithSpecAcceptanceLow",
          f"({ACCEPTANCE_5M} < on (profile) group_left () ({ACCEPTANCE_FRACTION} * {EXPECTED_ACCEPTANCE})) "
          f"and on ({C.BY}) {VERIFY_STEPS_5M} > {MIN_VERIFY_STEPS_PER_S}",
          "15m", "warning",
          "Speculative acceptance on {{ $labels.target }} is {{ $value | printf \"%.2f\" }} tokens/step",
          f"Below {ACCEPTANCE_FRACTION:.0%} of the profile's published acceptance length for 15 minutes, with at "
          f"least {MIN_VERIFY_STEPS_PER_S:g} verification steps/s (real traffic, not the canary alone). "
          "A zeroed mask embedding or a wrong draft checkpoint halves acceptance.",
          ("The Ornith dashboard: acceptance per position (vLLM) and draft-acceptance ratio: all positions low "
           "means the draft is wrong; only late positions low means unusual traffic.",
           "`ornith_engine_info{target=...}`: the draft model and engine version.",
           "The traffic: random or non-English text accepts less than the GSM8K figure the threshold is from."),
          ("Wrong or corrupt draft: re-download the draft checkpoint (`ornith-stack` model_weights) and restart.",
           "Traffic unlike the benchmark: a lower expected acceptance is an operating choice; change "
           "ACCEPTANCE_FRACTION and render.")),
    Alert("OrnithTimeToFirstTokenHigh",
          f"({TTFT_P95} > on (profile) group_left () {TTFT_THRESHOLD}) "
          f"or ({TTFT_P95} unless on (profile) {TTFT_THRESHOLD}) > {TTFT_P95_DEFAULT_S}",
          "5m", "warning",
          "TTFT p95 on {{ $labels.target }} is {{ $value | printf \"%.1f\" }} s",
          f"Time to first token p95 above the profile's threshold (1.5x its slowest published TTFT, else "
          f"{TTFT_P95_DEFAULT_S:g} s) for 5 minutes.",
          ("`ornith_requests_waiting`: a queue means too much load for the pool.",
           "`ornith_kv_cache_usage_ratio` near 1: preemption and recompute.",
           "Prompt length distribution: long prompts take long (prefill is linear or worse in length)."),
          ("Add replicas or lower concurrency at the client.",
           "Enable or check prefix caching: repeated system prompts should hit the cache.")),
    Alert("OrnithKVCacheNearlyFull", f"{C.KV_CACHE_USAGE.series} > {KV_CACHE_FULL_RATIO}", "5m", "warning",
          "KV cache on {{ $labels.target }} is {{ $value | humanizePercentage }} full",
          f"KV cache usage (SGLang full_token_usage, vLLM kv_cache_usage_perc; fullest rank) above "
          f"{KV_CACHE_FULL_RATIO:.0%} for 5 minutes: requests will be preempted or queued.",
          ("`ornith_requests_running` and the preemptions panel: is the engine preempting?",
           "Prompt and output length distributions: longer requests than the plan assumed?"),
          ("Lower the concurrency limit, or re-plan with `ornith-stack plan` for the observed lengths.",
           "More memory for the cache: a smaller max context or a larger memory fraction.")),
    Alert("OrnithMambaSlotsNearlyFull", f"{C.MAMBA_CACHE_USAGE.series} > {MAMBA_SLOTS_FULL_RATIO}", "5m", "warning",
          "Mamba state slots on {{ $labels.target }} are {{ $value | humanizePercentage }} used",
          f"Mamba state slot usage (SGLang mamba_usage; fullest rank) above {MAMBA_SLOTS_FULL_RATIO:.0%} for 5 "
          "minutes: new requests wait for a slot even with KV cache free.",
          ("`ornith_requests_running` against the profile's `max-running-requests`.",
           "The mamba radix cache strategy in the profile (extra_buffer holds more slots per request)."),
          ("Raise the mamba slot count (`max-mamba-cache-size`) if memory allows, or lower concurrency "
           "(`ornith-stack plan` accounts for both).",)),
    Alert("OrnithQueueBacklog", f"{C.REQUESTS_WAITING.series} > {QUEUE_BACKLOG_REQUESTS}", "5m", "warning",
          "{{ $value }} requests waiting on {{ $labels.target }}",
          f"More than {QUEUE_BACKLOG_REQUESTS} requests waited for 5 minutes without the queue draining.",
          ("Request rate against the benchmark's maximum concurrency for the profile.",
           "KV cache and mamba slot usage: a full cache stops admission."),
          ("Add replicas, or rate-limit at the gateway.",)),
    Alert("OrnithCanaryFailing",
          f"{C.CANARY_SUCCESS.series} == 0 and on ({TARGET_LABELS}) {C.ENGINE_UP.series} == 1", "5m", "critical",
          "Canary requests to {{ $labels.target }} fail",
          "The engine answers /metrics but the canary's known-answer request has not completed for 5 minutes: "
          "the API is broken while the process is alive.",
          ("The exporter's log: the canary's HTTP status or error.",
           "`curl http://ENGINE/v1/models`: the served model name the canary asks for."),
          ("A hung engine: restart it.", "A renamed served model: fix `served_name` in the profile and render.")),
    Alert("OrnithCanaryWrong", f"{C.CANARY_CORRECT.series} == 0", "10m", "warning",
          "Canary answers from {{ $labels.target }} are wrong",
          "The engine answers the canary's fixed greedy question wrongly: check the model, chat template and "
          "draft (a speculative bug changes greedy output).",
          ("`ornith_engine_info{target=...}`: model, draft, engine version (a new version?).",
           "Ask the canary's question by hand with temperature 0, with and without the draft."),
          ("Roll back the engine image or the weights to the last known-good pin (images.yaml).",)),
    Alert("OrnithCanaryStale", f"time() - {C.CANARY_LAST_RUN.series} > {CANARY_STALE_S}", "5m", "warning",
          "The canary for {{ $labels.target }} has not run for {{ $value | humanizeDuration }}",
          f"The exporter's canary has finished no run, successful or not, for more than {CANARY_STALE_S} s: it "
          "stopped, so canary alerts cannot fire.",
          ("The exporter's log: an exception in the canary thread.",),
          ("Restart the exporter.",)),
)


def ttft_threshold(profile: Profile) -> float | None:
    """1.5x the slowest TTFT the profile's seed published, or None (the default threshold applies)."""
    published = [point.ttft_s for point in (profile.expected.sweep if profile.expected else []) if point.ttft_s]
    return round(TTFT_SWEEP_FACTOR * max(published), 1) if published else None


def threshold_rules() -> list[dict[str, Any]]:
    """Constant series per profile: its lowest published acceptance length, its TTFT threshold."""
    rules = []
    for profile in load_all():
        per_task = profile.expected.acceptance_length if profile.expected else {}
        if per_task and profile.expected:
            task = min(per_task, key=per_task.__getitem__)
            rules.append({"record": EXPECTED_ACCEPTANCE, "expr": f"vector({per_task[task]})",
                          "labels": {"profile": profile.name, "task": task, "engine": profile.engine.kind,
                                     "source": profile.expected.source}})
        ttft = ttft_threshold(profile)
        if ttft is not None and profile.expected:
            rules.append({"record": TTFT_THRESHOLD, "expr": f"vector({ttft})",
                          "labels": {"profile": profile.name, "source": profile.expected.source}})
    return rules


def alert_rules() -> dict[str, Any]:
    return {"groups": [{"name": "ornith-alerts", "rules": [alert.rule() for alert in ALERTS]}]}


def runbook(alert: Alert) -> str:
    steps = "\n".join(f"{i}. {step}" for i, step in enumerate(alert.check, 1))
    fixes = "\n".join(f"- {fix}" for fix in alert.fix)
    return (f"# {alert.name}\n\nSeverity: **{alert.severity}**. Fires when, for {alert.duration}:\n\n"
            f"```promql\n{alert.expr}\n```\n\n## Meaning\n\n{alert.description}\n\n"
            f"## Check\n\n{steps}\n\n## Fix\n\n{fixes}\n")


def files(root: Path) -> Iterator[GeneratedFile]:
    for alert in ALERTS:
        yield GeneratedFile(f"{RUNBOOK_DIR}/{alert.name}.md", SOURCE,
                            lambda alert=alert: with_header(SOURCE, runbook(alert), "markdown"))  # type: ignore[misc]
