"""Alert rules with their guards, per-profile thresholds and runbooks (one Markdown file per alert).

An engine is in one of four states, each its own alert:
- starting (`OrnithEngineStarting`, info: pages nobody, inhibits the target's symptoms): first seen less
  than its start budget ago and not up yet, or up within the budget and now refusing connections (its
  process is loading again: a planned restart, or a crash the restart policy restarts);
- down (`OrnithEngineDown`, 2 minutes): up within the budget and now answering wrongly or not at all
  while it accepts connections (hung, broken, garbage);
- down past its start budget (`OrnithEngineDownLong`): never came up, or did not come back: pages once;
- flapping (`OrnithEngineFlapping`): up and down again and again, failing a share of the hour's scrapes.
The canary-failing alert needs the engine up; the acceptance alert needs a minimum rate of verification
steps (the canary alone, a few short requests a minute, does not qualify) and a longer `for`. TTFT
thresholds come from the profile's published sweep (spark's 262K context takes 122 s to its first
token); profiles without a sweep use the default. Meta-monitoring: `OrnithWatchdog` always fires (a
receiver that stops hearing it knows the alert path is broken) and `OrnithNotificationsFailing` reads
Alertmanager's own failed-notification counter, which Prometheus scrapes.
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
# runbook_url of every alert, in compose, Helm and Ansible alike: this absolute base and `<alert>.md`.
# The default is the runbooks in the repository's web view; point it at a wiki or a fork and render.
RUNBOOK_BASE = f"https://github.com/ornith-stack/ornith-stack/blob/main/{RUNBOOK_DIR}"
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
START_BUDGET = "20m"  # longer than the slowest model load (15 minutes): down this long pages anyway
FLAP_WINDOW = "1h"
FLAP_FAILED_SHARE = 0.2  # failed scrapes of the hour: a planned 15-minute restart is 25% but only 2 changes
FLAP_CHANGES = 6  # up/down changes within the hour: three outages (a planned restart makes two)
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


UP = C.ENGINE_UP.series
ON = f"on ({TARGET_LABELS})"
WAS_UP = f"max_over_time({UP}[{START_BUDGET}]) == 1"  # up at some point within the start budget
REFUSED = f'increase({C.SCRAPE_ERRORS.series}{{reason="connect"}}[2m]) > 0'  # nothing listens: (re)loading
YOUNG = f"({UP} unless {ON} {UP} offset {START_BUDGET})"  # first scraped less than the start budget ago
STARTING = f"{UP} == 0 and {ON} (({WAS_UP} and {ON} {REFUSED}) or {YOUNG})"
DOWN = f"{UP} == 0 and {ON} {WAS_UP} unless {ON} {REFUSED}"
FLAPPING = (f"avg_over_time({UP}[{FLAP_WINDOW}]) < {1 - FLAP_FAILED_SHARE:g} "
            f"and changes({UP}[{FLAP_WINDOW}]) >= {FLAP_CHANGES}")
NOTIFICATIONS_FAILED = "sum by (integration) (rate(alertmanager_notifications_failed_total[5m])) > 0"


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
    Alert("OrnithEngineDown", DOWN, "2m", "critical",
          "Engine {{ $labels.target }} was up and is now down",
          f"The exporter could not scrape and parse {{{{ $labels.target }}}}/metrics for 2 minutes after it was up "
          f"within the last {START_BUDGET}, while the engine still accepts connections: it hangs, fails or "
          "answers garbage. (An engine that refuses connections is reloading: OrnithEngineStarting.)",
          ("`ornith_exporter_scrape_errors_total{target=...}`: the reason (timeout, http_status, truncated, "
           "not_exposition, duplicate).",
           "The engine's logs (`docker compose logs engine`, `kubectl logs`): CUDA errors, OOM, NCCL timeouts.",
           "`nvidia-smi`: a GPU fell off the bus or a process holds the memory."),
          ("Restart the engine; a model load takes 7 to 15 minutes (`OrnithEngineStarting` meanwhile).",
           "OOM at start: lower `gpu-memory-utilization` / `mem-fraction-static` in the profile "
           "(`ornith-stack plan`).")),
    Alert("OrnithEngineDownLong", f"{UP} == 0", START_BUDGET, "critical",
          "Engine {{ $labels.target }} has been down for " + START_BUDGET,
          f"{{{{ $labels.target }}}} has not answered /metrics for {START_BUDGET}, its start budget: longer than the "
          "slowest model load, so it never came up or did not come back after a restart; it is stuck or gone.",
          ("The engine's logs: is the model still loading (progress lines), downloading weights, or looping on "
           "an error?", "`ornith-stack doctor`: driver, GPU, weights, ports.",
           "Disk: a full model cache stops a download silently."),
          ("Fix the error the logs show and restart the engine.",
           "A first download of the weights can exceed the budget: pre-fetch them (`model_weights` role).")),
    Alert("OrnithEngineStarting", STARTING, "0m", "info",
          "Engine {{ $labels.target }} is starting (not up yet)",
          f"{{{{ $labels.target }}}} is loading its model: first seen less than {START_BUDGET} ago and not up yet, "
          "or up within that budget and now refusing connections (a restart). Pages nobody; Alertmanager "
          "inhibits the target's canary and engine alerts while it lasts.",
          (f"Nothing, unless it lasts: after {START_BUDGET} down `OrnithEngineDownLong` pages.",),
          ("None needed.",)),
    Alert("OrnithEngineFlapping", FLAPPING, "5m", "critical",
          "Engine {{ $labels.target }} keeps going down and up",
          f"{{{{ $labels.target }}}} failed more than {FLAP_FAILED_SHARE:.0%} of its scrapes over the last "
          f"{FLAP_WINDOW} and changed between up and down at least {FLAP_CHANGES} times: a crash loop or an "
          "engine that answers only some of the time. No single outage lasts long enough for the down alerts.",
          ("`ornith_exporter_scrape_errors_total{target=...}` by reason: timeouts (overloaded, slow /metrics) or "
           "connect (restarts)?",
           "The engine's restart count (`docker compose ps`, `kubectl get pod`) and its logs before each restart.",
           "`ornith_exporter_engine_restarts_total{target=...}`: counters going back to zero."),
          ("A crash loop: fix the error the logs show (OOM: re-plan with `ornith-stack plan`).",
           "Timeouts under load: raise the exporter's `--timeout` or the scrape timeout.")),
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
    Alert("OrnithWatchdog", "vector(1)", "0m", "none",
          "The Ornith alert path works (always firing)",
          "Always fires, so the receiver hears from Alertmanager on every repeat: a receiver (a dead man's "
          "switch) that stops hearing it knows Prometheus, the rules or Alertmanager broke.",
          ("Nothing while it fires. If the receiver stopped hearing it: Prometheus' Alerts page, then "
           "Alertmanager's UI, then the webhook's logs.",),
          ("None needed while it fires.",)),
    Alert("OrnithNotificationsFailing", NOTIFICATIONS_FAILED, "5m", "critical",
          "Alertmanager fails to deliver notifications via {{ $labels.integration }}",
          "Alertmanager's own counter of failed notifications (alertmanager_notifications_failed_total) rose for "
          "5 minutes: pages are not arriving. The default compose webhook (.invalid) fails this way on purpose "
          "until ORNITH_ALERT_WEBHOOK_URL is set.",
          ("Alertmanager's log: the receiver's HTTP status or DNS error.",
           "The webhook URL: compose reads ORNITH_ALERT_WEBHOOK_URL, Ansible monitoring_alertmanager_webhook_url, "
           "Helm monitoring.alertmanagerConfig.webhookUrl."),
          ("Set the webhook URL and restart Alertmanager.",)),
)
# Alerts that fire by design all the time (no quiet case exists).
ALWAYS_FIRING = ("OrnithWatchdog",)


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
