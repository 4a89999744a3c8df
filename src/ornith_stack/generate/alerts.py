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
token); profiles without a sweep use the default. What users feel: multi-window, multi-burn-rate alerts on the error budget of three SLOs per profile
(Google SRE workbook, "Alerting on SLOs"): the gateway's 5xx share, the engines' failed share and the
share of requests whose first token is slower than the profile's threshold; the targets are the
profile's `slo`. A profile with no ready replica (every engine down or every worker unhealthy at the
gateway) pages after a planned restart's length, whatever the reason. Acceptance is judged against the
profile's published figure, the replica's own 1-day median and, without a published figure, a floor.
Meta-monitoring: `OrnithWatchdog` always fires (a
receiver that stops hearing it knows the alert path is broken) and `OrnithNotificationsFailing` reads
Alertmanager's own failed-notification counter, which Prometheus scrapes.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ornith_stack import deployment as D
from ornith_stack.engines import ADAPTERS, adapter_for
from ornith_stack.errors import UserError
from ornith_stack.exporter import catalogue as C
from ornith_stack.generate.core import GeneratedFile, with_header
from ornith_stack.profiles import Profile, load_shipped
from ornith_stack.profiles.model import Slo

RUNBOOK_DIR = "monitoring/runbooks"
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
# The one setting of the runbook links: [project.urls] Runbooks in pyproject.toml.
RUNBOOK_URL_KEY = "Runbooks"
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
START_BUDGET_MINUTES = 20  # longer than the slowest model load (15 minutes): down this long pages anyway
START_BUDGET = f"{START_BUDGET_MINUTES}m"
# OrnithEngineDown looks this much further back than the start budget, so that it still fires when
# OrnithEngineDownLong takes over (which inhibits it): ending exactly at the budget, it stopped up to a
# scrape interval before the other began, and a hung engine had no alert for one evaluation (issue 33).
DOWN_HANDOVER_MINUTES = 5
DOWN_WINDOW = f"{START_BUDGET_MINUTES + DOWN_HANDOVER_MINUTES}m"
FLAP_WINDOW = "1h"
FLAP_FAILED_SHARE = 0.2  # failed scrapes of the hour: a planned 15-minute restart is 25% but only 2 changes
FLAP_CHANGES = 6  # up/down changes within the hour: three outages (a planned restart makes two)
CANARY_STALE_S = 300  # 10 canary intervals of 30 s
# A total outage shorter than this pages nobody: a planned restart (about 3 minutes) fits in it, and the
# single compose engine refusing connections still pages 15 minutes before its start budget ends.
PLANNED_RESTART = "5m"
# Multi-window, multi-burn-rate alerts on the error budget (Google SRE workbook, "Alerting on SLOs",
# table 5-8): (long window, short window, burn rate). A 14.4x burn spends 2% of a 30-day budget in an hour.
PAGE_BURNS = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
TICKET_BURNS = (("1d", "2h", 3.0), ("3d", "6h", 1.0))
BURN_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# The minimum-traffic guard: a burn alert needs this many requests in its long window. Fewer make a share of
# noise (one failed request of six in an hour is a 17% share, a 17x burn at 99%); a total outage at one
# request a minute still has 60 an hour.
MIN_SLO_EVENTS = 20
# Acceptance against the replica's own level: below 80% of its median over the last day (a 30% decay
# over 2 hours crosses it after about 80 minutes, whatever level it decays from).
ACCEPTANCE_OWN_FRACTION = 0.8
ACCEPTANCE_OWN_WINDOW = "1d"
# Profiles with a draft model and no published acceptance: below 1.5 tokens per verification step the
# draft barely helps (DFlash's published figures are 5 to 6.1).
ACCEPTANCE_FLOOR = 1.5

# Recording rules the alerts read (monitoring/prometheus/rules/ornith-recording.yml); names in the catalogue.
ACCEPTANCE_5M = C.SPEC_ACCEPTANCE_LENGTH.name
VERIFY_STEPS_5M = C.SPEC_VERIFY_STEPS_PER_SECOND.name
EXPECTED_ACCEPTANCE, TTFT_THRESHOLD, TTFT_P95 = C.EXPECTED_ACCEPTANCE, C.TTFT_THRESHOLD, C.TTFT_P95.name
# Recorded here (SLO and acceptance-level rules the alerts alone read; the dashboards read none of them).
ACCEPTANCE_FLOOR_RECORD = "ornith:profile_acceptance_floor_length"
ACCEPTANCE_MEDIAN = f"ornith:spec_acceptance_length:median{ACCEPTANCE_OWN_WINDOW}"
ERROR_BUDGET = "ornith:slo_error_budget"  # 1 - the profile's target, per profile and SLO


def bad_share_record(window: str) -> str:
    """The recorded share of every SLO's bad events over `window` (label `slo`)."""
    return f"ornith:slo_bad_events:ratio_rate{window}"


def events_record(window: str) -> str:
    """The recorded rate (per second) of every SLO's events over `window` (label `slo`): the guard's count."""
    return f"ornith:slo_events:rate{window}"


def _seconds(window: str) -> int:
    return int(window[:-1]) * {"m": 60, "h": 3600, "d": 86400}[window[-1]]


def burn_rate(window: str) -> str:
    """The recorded burn rate of every SLO over `window` (label `slo`): its bad share / its error budget."""
    return f"ornith:slo_error_budget_burn:rate{window}"


# Where Helm puts the release's namespace (prometheusrule.yaml replaces it): alerts whose series carry
# none (the watchdog, Alertmanager's counter, an absent target) need it for the namespaced routing.
NAMESPACE_PLACEHOLDER = "ORNITH_RELEASE_NAMESPACE"
# The Helm rule group of the gateway's discovery check; the chart keeps it only with gateway.enabled.
GATEWAY_DISCOVERY_GROUP = "ornith-gateway-discovery"
# Where Helm puts the release's engine replicas (engine.replicas; prometheusrule.yaml replaces it).
REPLICAS_PLACEHOLDER = "ORNITH_RELEASE_REPLICAS"


@cache
def runbook_base() -> str:
    """The runbooks' base URL: [project.urls] Runbooks in pyproject.toml (read when rendering)."""
    urls = tomllib.loads(PYPROJECT.read_text())["project"].get("urls", {})
    if RUNBOOK_URL_KEY not in urls:
        raise UserError(f"{PYPROJECT}: no [project.urls] {RUNBOOK_URL_KEY} = \"https://...\" (the runbooks' base URL)")
    return str(urls[RUNBOOK_URL_KEY]).rstrip("/")


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
    # Its series carry no namespace (Helm gives it the release's: the chart's Alertmanager route needs one).
    namespaceless: bool = False

    @property
    def runbook(self) -> str:
        return f"{runbook_base()}/{self.name}.md"

    def rule(self, helm: bool = False) -> dict[str, Any]:
        labels = {"severity": self.severity}
        if helm and self.namespaceless:
            labels["namespace"] = NAMESPACE_PLACEHOLDER
        return {"alert": self.name, "expr": self.expr, "for": self.duration, "labels": labels,
                "annotations": {"summary": self.summary, "description": self.description,
                                "runbook_url": self.runbook}}


UP = C.ENGINE_UP.series
ON = f"on ({TARGET_LABELS})"
# While the exporter itself is down (its `up` 0, or gone), the engines' last state holds for EXPORTER_HOLD
# instead of vanishing: a dead exporter is one page (OrnithExporterDown) and resolves nothing it can no
# longer see (an engine still hung stays paged), and starts nothing new either (the state is frozen).
EXPORTER_HOLD = "1h"
EXPORTER_SEEN = f'up{{job="{D.EXPORTER_JOB}"}} == 1'


def held(series: str) -> str:
    """`series` (an exporter's), or while the exporter is not up its last value within EXPORTER_HOLD."""
    return f"({series} or (last_over_time({series}[{EXPORTER_HOLD}]) unless on (namespace) {EXPORTER_SEEN}))"


UP_HELD = held(UP)
def _was_up(window: str) -> str:
    return f"max_over_time({UP}[{window}]) == 1"  # up at some point within `window`


WAS_UP = _was_up(START_BUDGET)
REFUSED = f'increase({C.SCRAPE_ERRORS.series}{{reason="connect"}}[2m]) > 0'  # nothing listens: (re)loading
YOUNG = f"({UP} unless {ON} {UP} offset {START_BUDGET})"  # first scraped less than the start budget ago
STARTING = f"{UP} == 0 and {ON} (({WAS_UP} and {ON} {REFUSED}) or {YOUNG})"
DOWN = f"{UP_HELD} == 0 and {ON} {_was_up(DOWN_WINDOW)} unless {ON} {REFUSED}"
FLAPPING = (f"avg_over_time({UP}[{FLAP_WINDOW}]) < {1 - FLAP_FAILED_SHARE:g} "
            f"and changes({UP}[{FLAP_WINDOW}]) >= {FLAP_CHANGES}")
NOTIFICATIONS_FAILED = "sum by (integration) (rate(alertmanager_notifications_failed_total[5m])) > 0"
# Meta-monitoring (issue 44): every scrape job's target, the rules' evaluations, the service discovery.
RAW_JOBS = (D.ENGINE_JOB, D.GATEWAY_JOB, D.PROMETHEUS_JOB, D.ALERTMANAGER_JOB)  # the exporter: OrnithExporterDown
TARGET_DOWN = f'up{{job=~"{"|".join(RAW_JOBS)}"}} == 0'
RULES_FAILING = "sum by (rule_group) (increase(prometheus_rule_evaluation_failures_total[10m])) > 0"
DISCOVERY_FAILING = ("sum by (instance) (increase(prometheus_sd_http_failures_total[10m])) > 0 or "
                     "sum by (instance) (increase(prometheus_sd_kubernetes_failures_total[10m])) > 0")

# What users feel beyond the SLOs (issue 44): the model cache's disk, the GPUs, clients giving up.
# The disk: a ticket below CACHE_NEARLY_FULL_SHARE free; a page where, with less than CACHE_FILLING_SHARE free,
# the trend of the last CACHE_FILL_WINDOW (a least-squares line) runs out within CACHE_FILL_HOURS while the free
# space is still falling (node-exporter's filesystem alerts take the same window and horizon).
CACHE_NEARLY_FULL_SHARE = 0.10
CACHE_FILLING_SHARE = 0.15
CACHE_FILL_WINDOW = "6h"
CACHE_FILL_HOURS = 4
CACHE_FREE_SHARE = f"{C.MODEL_CACHE_FREE.series} / {C.MODEL_CACHE_SIZE.series}"
# Still falling over CACHE_FALLING_WINDOW: a download that ended is a step the 6-hour line keeps pointing down
# for hours after, while nothing writes any more.
CACHE_FALLING_WINDOW = "30m"
CACHE_FILLING = (f"{CACHE_FREE_SHARE} < {CACHE_FILLING_SHARE:g} and "
                 f"predict_linear({C.MODEL_CACHE_FREE.series}[{CACHE_FILL_WINDOW}], {CACHE_FILL_HOURS} * 3600) < 0 "
                 f"and deriv({C.MODEL_CACHE_FREE.series}[{CACHE_FALLING_WINDOW}]) < 0")
# Clients giving up: the share of finished requests an abort ended, over ABORT_WINDOW per profile, a ticket above
# ABORTED_SHARE with at least MIN_SLO_EVENTS finished requests in the window (one abort in an idle hour is 100%).
ABORT_WINDOW = "1h"
ABORTED_SHARE = 0.2
ABORT_BY = "profile, namespace"
_FINISHED = f"sum by ({ABORT_BY}) (increase({C.REQUESTS_FINISHED.series}[{ABORT_WINDOW}]))"
ABORTS_HIGH = (f"sum by ({ABORT_BY}) (increase({C.REQUESTS_ABORTED.series}[{ABORT_WINDOW}])) / {_FINISHED} "
               f"> {ABORTED_SHARE:g} and on ({ABORT_BY}) {_FINISHED} >= {MIN_SLO_EVENTS}")
# A GPU that stopped answering (or vanished) while NVML answers for the rest, or NVML failing as a whole; held
# like the engines' state while the exporter is down. An engine's memory is full by design: no alert on it.
NVML_ERROR = f'{C.GPU_NVML_STATE.series}{{state="error"}}'
GPU_LOST = f"{held(C.GPU_UP.series)} == 0"
NVML_FAILING = f"{held(NVML_ERROR)} == 1"

# The Model Gateway's own metrics (sglang-router 0.3.2, tests/fixtures/gateway/metrics.txt), job "gateway".
# 1 while the gateway's health checks pass the worker, 0 while they fail it, and -1 once it left the rotation
# (removed through the worker API, or gone from Kubernetes' discovery): smg 0.3.2 keeps the series of a removed
# worker at -1 (measured), so neither a sum nor a count of it says how many replicas serve.
GATEWAY_HEALTH = "smg_worker_health"
GATEWAY_RESPONSES = "smg_http_responses_total"  # every answer the gateway gave, by status_code (probes too)
# The gateway SLO counts users' requests only: those to the API's routes (smg_http_requests_total by path;
# its health probes and /v1/models are not users' requests), good when a worker answered them without a 5xx
# (smg_router_upstream_responses_total by status_code); a request the gateway failed itself (no healthy
# worker: its own 503) has no upstream answer and is bad.
GATEWAY_REQUESTS = "smg_http_requests_total"
GATEWAY_UPSTREAM = "smg_router_upstream_responses_total"
GATEWAY_USER_PATHS = "/v1/chat/completions|/v1/completions|/v1/responses|/v1/embeddings|/generate"
# SLOs are per profile (and namespace, in Kubernetes): what the users of one deployment feel.
SLO_BY = "profile, namespace"
SLO_TARGETS = {"gateway": "availability", "engine": "availability", "ttft": "ttft_target"}  # slo -> Slo field
GATEWAY_UP = f'up{{job="{D.GATEWAY_JOB}"}}'
READY = f"sum by ({SLO_BY}) ({UP_HELD})"
# A profile first seen less than its start budget ago: a first deployment still loading its model.
NEW_PROFILE = f"(count by ({SLO_BY}) ({UP}) unless on ({SLO_BY}) count by ({SLO_BY}) ({UP} offset {START_BUDGET}))"
NO_READY = (f"({READY} == 0 unless on ({SLO_BY}) {NEW_PROFILE}) "
            f'or (max by ({SLO_BY}) ({GATEWAY_HEALTH}{{job="{D.GATEWAY_JOB}"}}) < 1)')


def _burning(burns: tuple[tuple[str, str, float], ...]) -> str:
    """Both windows above the rate, and at least MIN_SLO_EVENTS requests in the long one."""
    return " or ".join(f"({burn_rate(long)} > {rate:g} and {burn_rate(short)} > {rate:g} and on ({SLO_BY}, slo) "
                       f"{events_record(long)} * {_seconds(long)} >= {MIN_SLO_EVENTS})"
                       for long, short, rate in burns)


def burns_text(burns: tuple[tuple[str, str, float], ...]) -> str:
    return " or ".join(f"{rate:g}x over both {long} and {short}" for long, short, rate in burns)


SLO_MEANING = ("SLOs per profile (targets in the profile's `slo`): `gateway`, the share of users' requests "
               "(the API's routes, not health probes) no worker answered without a 5xx; `engine`, the share of "
               "requests the engines failed (vLLM finished_reason=\"error\"; SGLang counts none: its abort "
               "counter counts abort calls); `ttft`, the share of requests whose first token came later than the "
               f"profile's `slo.ttft_seconds`. At least {MIN_SLO_EVENTS} requests in the long window (a "
               "minimum-traffic guard).")


ALERTS: tuple[Alert, ...] = (
    Alert("OrnithExporterDown", f'up{{job="{D.EXPORTER_JOB}"}} == 0', "2m", "critical",
          "The ornith exporter {{ $labels.instance }} is not answering",
          "Prometheus could not scrape the exporter for 2 minutes; no engine metrics arrive, so every other "
          "Ornith alert is blind.",
          ("`docker compose ps exporter` (compose) or `systemctl status ornith-exporter` (host): is it running?",
           f"`curl -s http://EXPORTER:{D.EXPORTER_PORT}{D.METRICS_PATH} | head`: does it answer within the scrape "
           "timeout?",
           "Prometheus' Targets page: the scrape error (connection refused, timeout, DNS)."),
          ("Restart the exporter; its logs say why it stopped.",
           "A timeout: raise the scrape timeout or lower the exporter's `--timeout`.")),
    Alert("OrnithErrorBudgetBurn", _burning(PAGE_BURNS), "2m", "critical",
          "{{ $labels.profile }}: the {{ $labels.slo }} SLO's error budget burns {{ $value | printf \"%.1f\" }}x",
          f"{SLO_MEANING} The bad share burns the 30-day error budget at {burns_text(PAGE_BURNS)} (Google SRE "
          "workbook, multi-window multi-burn-rate): users see failures now. A traffic lull (no requests) has no "
          "share and never fires.",
          ("`ornith:slo_error_budget_burn:rate5m{slo=...}`: which SLO, since when.",
           "slo=gateway: `smg_router_upstream_responses_total` by status_code (the workers' answers), "
           "`smg_http_requests_total` by path (users' requests) and `smg_worker_health`: requests without a "
           "worker's answer mean no healthy worker, a 5xx answer an engine failing behind it.",
           "slo=engine: the engine's logs and the dashboard's finish-reason panel (errors, aborts).",
           "slo=ttft: `ornith_requests_waiting` and the KV cache: too much load for the pool."),
          ("Fix the failing part (restart the engine or gateway, roll back the last change).",
           "Too much load: add replicas or rate-limit at the client.")),
    Alert("OrnithErrorBudgetBurnSlow", _burning(TICKET_BURNS), "15m", "warning",
          "{{ $labels.profile }}: the {{ $labels.slo }} SLO's error budget burns {{ $value | printf \"%.1f\" }}x",
          f"{SLO_MEANING} The bad share burns the 30-day error budget at {burns_text(TICKET_BURNS)}: at this "
          "pace the budget runs out within the month. A ticket, not a page.",
          ("The same as OrnithErrorBudgetBurn, over days: which SLO, since when, which replica.",),
          ("Find and fix the slow leak (a replica failing some requests, a slower release, more load).",)),
    Alert("OrnithNoReadyReplicas", NO_READY, PLANNED_RESTART, "critical",
          "{{ $labels.profile }} has no ready replica",
          f"No engine of the profile has answered for {PLANNED_RESTART} (down, hung, refusing connections, "
          "restarting), or the Model Gateway's health checks fail every worker: every request fails, whatever "
          f"the reason. A planned restart shorter than {PLANNED_RESTART} and a first deployment loading for its "
          f"{START_BUDGET} start budget page nobody; Alertmanager inhibits the profile's per-engine pages while "
          "this lasts.",
          ("`ornith_engine_up{profile=...}` and `ornith_exporter_scrape_errors_total` by reason: refused "
           "(restarting, crashed), timeout (hung).",
           "`smg_worker_health`: the gateway's view of each worker.",
           "The engines' logs (`docker compose logs engine`, `kubectl logs`)."),
          ("Restart the engines; a model load takes 7 to 15 minutes.",
           "A planned restart longer than " + PLANNED_RESTART + ": silence this alert for its length first.")),
    Alert("OrnithGatewayDown", f"{GATEWAY_UP} == 0", PLANNED_RESTART, "critical",
          "The Model Gateway {{ $labels.instance }} is not answering",
          f"Prometheus could not scrape the gateway's metrics for {PLANNED_RESTART}: the gateway is the one "
          "endpoint of the replicas, so every request fails.",
          ("`docker compose ps gateway` or `kubectl get pod -l app.kubernetes.io/component=gateway`.",
           "The gateway's logs."),
          ("Restart the gateway; the engines keep their state.",)),
    Alert("OrnithEngineDown", DOWN, "2m", "critical",
          "Engine {{ $labels.target }} was up and is now down",
          f"The exporter could not scrape and parse {{{{ $labels.target }}}}/metrics for 2 minutes after it was up "
          f"within the last {DOWN_WINDOW} (past {START_BUDGET} OrnithEngineDownLong takes over), while "
          "the engine still accepts connections: it hangs, fails or answers garbage. (An engine that refuses "
          "connections is reloading: OrnithEngineStarting.)",
          ("`ornith_exporter_scrape_errors_total{target=...}`: the reason (timeout, http_status, truncated, "
           "not_exposition, duplicate).",
           "The engine's logs (`docker compose logs engine`, `kubectl logs`): CUDA errors, OOM, NCCL timeouts.",
           "`nvidia-smi`: a GPU fell off the bus or a process holds the memory."),
          ("Restart the engine; a model load takes 7 to 15 minutes (`OrnithEngineStarting` meanwhile).",
           "OOM at start: lower `gpu-memory-utilization` / `mem-fraction-static` in the profile "
           "(`ornith-stack plan`).")),
    Alert("OrnithEngineDownLong", f"{UP_HELD} == 0", START_BUDGET, "critical",
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
          f"({ACCEPTANCE_5M} < on (profile) group_left () {ACCEPTANCE_FLOOR_RECORD} "
          f"or {ACCEPTANCE_5M} < {ACCEPTANCE_OWN_FRACTION} * {ACCEPTANCE_MEDIAN}) "
          f"and on ({C.BY}) {VERIFY_STEPS_5M} > {MIN_VERIFY_STEPS_PER_S}",
          "15m", "warning",
          "Speculative acceptance on {{ $labels.target }} is {{ $value | printf \"%.2f\" }} tokens/step",
          f"For 15 minutes below {ACCEPTANCE_FRACTION:.0%} of the profile's published acceptance length (a "
          f"profile with a draft model and no published figure: below {ACCEPTANCE_FLOOR:g} tokens/step), or "
          f"below {ACCEPTANCE_OWN_FRACTION:.0%} of the replica's own median over the last {ACCEPTANCE_OWN_WINDOW} "
          f"(a decay, whatever level it starts from), with at least {MIN_VERIFY_STEPS_PER_S:g} verification "
          "steps/s (real traffic, not the canary alone). A zeroed mask embedding or a wrong draft checkpoint "
          "halves acceptance.",
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
    Alert("OrnithClientAbortsHigh", ABORTS_HIGH, "15m", "warning",
          "{{ $labels.profile }}: {{ $value | humanizePercentage }} of requests ended by an abort",
          f"More than {ABORTED_SHARE:.0%} of the requests the profile's engines finished over the last {ABORT_WINDOW} "
          f"were ended by an abort, for 15 minutes, with at least {MIN_SLO_EVENTS} finished requests in the window "
          "(one abort in an idle hour is no trend): clients give up before their answer, usually because it is "
          "too slow. vLLM counts the requests whose client went away (finish reason abort); SGLang counts abort "
          "calls (one may end several requests: a lower bound), and 0.5.17 counts nothing for a client that "
          "went away. A ticket: the TTFT SLO pages when users wait too long.",
          ("The dashboard's *Requests by finish reason* and *Client aborts* panels: which replica, since when.",
           "Time to first token and the queue (`ornith_requests_waiting`): slow answers make clients leave.",
           "The clients: a new timeout, a retrying client that aborts its own requests, a load test."),
          ("Too slow: add replicas or lower the load (OrnithTimeToFirstTokenHigh's runbook).",
           "A client's timeout shorter than the profile's answers (a 262K-token prompt takes minutes): raise it.")),
    Alert("OrnithModelCacheDiskNearlyFull", f"{CACHE_FREE_SHARE} < {CACHE_NEARLY_FULL_SHARE:g}", "15m", "warning",
          "{{ $labels.profile }}: the model cache {{ $labels.path }} has {{ $value | humanizePercentage }} free",
          f"The file system of the model cache (the engines' HF_HOME, as the exporter sees it mounted read-only) "
          f"has had less than {CACHE_NEARLY_FULL_SHARE:.0%} of its size free for 15 minutes: the next model, draft "
          "or revision download will fail part-way, and an engine that must download at start cannot start.",
          ("How much each model takes: compose `docker compose -p ornith-<profile> -f compose/<profile>.yml exec "
           f"{D.EXPORTER_SERVICE} sh -c 'df -h {D.HF_HOME_IN_CONTAINER}; du -sh {D.HF_HOME_IN_CONTAINER}/hub/*'`; "
           f"Helm `kubectl -n <namespace> exec <engine pod> -c {D.EXPORTER_SERVICE} -- sh -c 'df -h /data/hf; "
           "du -sh /data/hf/hub/*'` (modelCache.mountPath); Ansible host `df -h /var/lib/ornith/hf; du -sh "
           "/var/lib/ornith/hf/hub/*` (ornith_service_hf_cache).",
           "Old revisions and models no profile serves any more (`models--ORG--NAME/snapshots/*`).",
           "Something else on the same file system (compose's named volumes share Docker's disk)."),
          ("Delete the models and revisions no profile serves (`rm -r .../hub/models--ORG--NAME`), never the "
           "running profile's pinned revision.",
           "Grow the disk: Helm modelCache.size (if the StorageClass allows expansion); compose and Ansible "
           "ORNITH_HF_CACHE / ornith_service_hf_cache on a larger disk.")),
    Alert("OrnithModelCacheDiskFillingUp", CACHE_FILLING, "30m", "critical",
          "{{ $labels.profile }}: the model cache {{ $labels.path }} will be full within "
          f"{CACHE_FILL_HOURS} hours",
          f"Less than {CACHE_FILLING_SHARE:.0%} of the model cache's file system is free and its trend over the last "
          f"{CACHE_FILL_WINDOW} (predict_linear) reaches zero within {CACHE_FILL_HOURS} hours, for 30 minutes: a "
          f"download or something else writing there will fill it, and a full cache stops downloads and starts. The "
          f"free space must still be falling over the last {CACHE_FALLING_WINDOW}: a download that ended leaves a "
          "step the 6-hour line points down from for hours, with nothing writing any more (that is a ticket, "
          "OrnithModelCacheDiskNearlyFull, when little is left).",
          ("What writes there now: a download Job or role (`kubectl get jobs`, the model_weights role), an engine "
           "downloading at start, another container on Docker's disk.",
           "The sizes, as in OrnithModelCacheDiskNearlyFull's runbook."),
          ("Stop the writer that is not meant to run, then free or grow the disk as OrnithModelCacheDiskNearlyFull's "
           "runbook says.",)),
    Alert("OrnithModelCacheUnreadable", f"{C.MODEL_CACHE_READABLE.series} == 0", "15m", "warning",
          "The exporter cannot read the model cache {{ $labels.path }} ({{ $labels.profile }})",
          "statvfs of the model cache path failed for 15 minutes: the cache is not mounted into the exporter "
          "(its volume was left out of the exporter's container) or the file system fails, so the disk alerts "
          "are blind.",
          ("Compose: `docker compose -p ornith-<profile> -f compose/<profile>.yml exec exporter ls /data/hf` (the "
           "hf-cache volume or ORNITH_HF_CACHE, read-only); Helm: the exporter container's `model-cache` volume "
           "mount; Ansible host: the unit's `--volume` of ornith_service_hf_cache.",
           "The host's kernel log for I/O errors of that disk."),
          ("Render and deploy again (`ornith-stack render`, `ornith-stack up`, `helm upgrade`, the playbook): every "
           "path mounts the cache into the exporter read-only.",)),
    Alert("OrnithGpuLost", GPU_LOST, "2m", "critical",
          "{{ $labels.profile }}: GPU {{ $labels.gpu }} ({{ $labels.uuid }}) stopped answering NVML",
          "For 2 minutes NVML has not answered for a GPU it listed, or no longer lists it (fallen off the bus, an "
          "Xid error, a GPU lost): the engine on it crashes or hangs, and a restart will not help until the GPU is "
          "back. GPU memory near full is normal (static pools) and pages nobody.",
          ("`nvidia-smi` on the host (compose, Ansible host) or in the engine pod (`kubectl -n <namespace> exec "
           "<engine pod> -- nvidia-smi`): a GPU missing, `ERR!`, or 'GPU is lost'.",
           "The host's kernel log: `journalctl -k | grep -i -e xid -e NVRM` (Xid 79: fallen off the bus).",
           "The engine's logs: CUDA errors since the GPU went."),
          ("Drain the host (Helm: `kubectl cordon` the node), reset the GPU (`nvidia-smi -r -i <gpu>`) or reboot, "
           "then start the engine again; repeated Xid 79 is hardware: call the vendor.",
           "The exporter keeps reporting a GPU it once listed until it restarts: restart it after a GPU was "
           "removed on purpose.")),
    Alert("OrnithNvmlFailing", NVML_FAILING, "2m", "critical",
          "{{ $labels.profile }}: NVML fails on {{ $labels.instance }}",
          "For 2 minutes the exporter's NVML calls have failed as a whole: the NVIDIA driver is not loaded or "
          "answers errors, or the exporter of a GPU profile (`--gpu-metrics required`) finds no NVML at all. The "
          "engines' GPUs cannot be seen, and a driver that fails takes the engines with it.",
          ("The exporter's log: NVML's reason (its GPU state changes are logged once each).",
           "`nvidia-smi` on the host or in the engine pod: does the driver answer?",
           "No NVML in the exporter's container while the host's driver works: its NVIDIA runtime is missing "
           "(compose `deploy.resources.reservations.devices` of the exporter service, Ansible the unit's `--gpus`, "
           "Helm the sidecar's runtimeClassName and NVIDIA_VISIBLE_DEVICES)."),
          ("A driver that fails: reboot the host, or reinstall the driver (the nvidia_driver role).",
           "The exporter without the NVIDIA runtime: render and deploy again; where it cannot have the GPUs, "
           "run it with `--gpu-metrics off` (Helm exporter.gpuMetrics: \"off\").")),
    Alert("OrnithCanaryFailing",
          f"{held(C.CANARY_SUCCESS.series)} == 0 and on ({TARGET_LABELS}) {UP_HELD} == 1", "5m", "critical",
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
    Alert("OrnithTargetDown", TARGET_DOWN, "5m", "warning",
          "Prometheus cannot scrape {{ $labels.job }} at {{ $labels.instance }}",
          f"A target of job {{{{ $labels.job }}}} ({', '.join(RAW_JOBS)}: the engines' and the gateway's own "
          "metrics, Prometheus' and Alertmanager's) has failed its scrapes for 5 minutes: its panels and the "
          "alerts that read it are blind. (The exporter has OrnithExporterDown; an engine's state its own alerts, "
          "which inhibit this one.)",
          ("Prometheus' Targets page: the scrape error (refused, timeout, 401: a changed monitoring password).",
           "`docker compose ps` (compose), `systemctl status prometheus prometheus-alertmanager` (Ansible host), "
           "`kubectl get pods` (Helm): is it running?"),
          ("Restart what stopped; a 401: run `ornith-stack up` again so every service has the same password.",)),
    Alert("OrnithRuleEvaluationFailing", RULES_FAILING, "5m", "warning",
          "Prometheus fails to evaluate the rules of {{ $labels.rule_group }}",
          "prometheus_rule_evaluation_failures_total rose in the last 10 minutes: some recording or alert rule "
          "of the group fails (a query error, many-to-many matching), so its alerts cannot fire.",
          ("Prometheus' Rules page: the rule in error and its message.",
           "`promtool check rules` on the rule files; a series with a duplicate label set after a relabel."),
          ("Fix the generator (src/ornith_stack/generate/alerts.py) or the relabeling, `ornith-stack render`, reload "
           "Prometheus.",), namespaceless=True),
    Alert("OrnithDiscoveryFailing", DISCOVERY_FAILING, "5m", "warning",
          "Prometheus' service discovery fails on {{ $labels.instance }}",
          "Prometheus' HTTP service discovery (the exporter's /sd/engines and /sd/gateways) or Kubernetes "
          "discovery failed in the last 10 minutes: new or moved engines are not scraped, and the targets "
          "Prometheus keeps are the last it saw.",
          ("Prometheus' Service Discovery page and log: the failing URL or API call.",
           "The exporter (compose, Ansible host): OrnithExporterDown inhibits this alert while it lasts."),
          ("Restart the exporter; in Kubernetes check Prometheus' RBAC for the release's namespace.",),
          namespaceless=True),
    Alert("OrnithWatchdog", "vector(1)", "0m", "none",
          "The Ornith alert path works (always firing)",
          "Always fires, so the heartbeat receiver hears from Alertmanager on every repeat, at its own URL "
          "(compose ORNITH_HEARTBEAT_URL, Ansible monitoring_alertmanager_heartbeat_url, Helm "
          "monitoring.alertmanagerConfig.heartbeatUrl), never the pager's: a dead man's switch that stops "
          "hearing it knows Prometheus, the rules or Alertmanager broke.",
          ("Nothing while it fires. If the receiver stopped hearing it: Prometheus' Alerts page, then "
           "Alertmanager's UI, then the webhook's logs.",),
          ("None needed while it fires.",), namespaceless=True),
    Alert("OrnithNotificationsFailing", NOTIFICATIONS_FAILED, "5m", "critical",
          "Alertmanager fails to deliver notifications via {{ $labels.integration }}",
          "Alertmanager's own counter of failed notifications (alertmanager_notifications_failed_total) rose for "
          "5 minutes: pages are not arriving. The default compose webhook (.invalid) fails this way on purpose "
          "until ORNITH_ALERT_WEBHOOK_URL is set.",
          ("Alertmanager's log: the receiver's HTTP status or DNS error.",
           "The webhook URL: compose reads ORNITH_ALERT_WEBHOOK_URL, Ansible monitoring_alertmanager_webhook_url, "
           "Helm monitoring.alertmanagerConfig.webhookUrl."),
          ("Set the webhook URL and restart Alertmanager.",), namespaceless=True),
)
# Alerts that fire by design all the time (no quiet case exists).
ALWAYS_FIRING = ("OrnithWatchdog",)



def _absent(job: str, what: str) -> Alert:
    """A scrape target of this release gone from Kubernetes' service discovery: no `up` series at all, which
    `up == 0` never sees. Helm only (compose and Ansible list their targets statically)."""
    return Alert(f"Ornith{what}Absent", f'absent(up{{job="{job}", namespace="{NAMESPACE_PLACEHOLDER}"}})',
                 PLANNED_RESTART, "critical", f"No {what.lower()} target in {{{{ $labels.namespace }}}}",
                 f"Prometheus has had no {what.lower()} target (job {job}) in the release's namespace for "
                 f"{PLANNED_RESTART}: its Service, ServiceMonitor or pods are gone from service discovery, so "
                 "nothing it would report can alert.",
                 (f"`kubectl get pods,svc,servicemonitor -l app.kubernetes.io/instance=...`: is the {what.lower()} "
                  "deployed and selected?", "Prometheus' Service Discovery page: the ServiceMonitor's targets."),
                 ("Redeploy the release (`helm upgrade`); check the ServiceMonitor's labels against Prometheus' "
                  "serviceMonitorSelector.",))


EXPORTER_ABSENT = _absent(D.EXPORTER_JOB, "Exporter")
GATEWAY_ABSENT = _absent(D.GATEWAY_JOB, "Gateway")
# Kubernetes: a replica whose pod is gone (deleted, evicted, its replacement unschedulable) takes its sidecar
# exporter along, so no engine series says it is missing; the gateway's discovery still does: its worker list
# (smg_worker_health 0 or 1; a removed worker stays at -1) is shorter than engine.replicas.
REPLICAS_MISSING = Alert(
    "OrnithReplicasMissing",
    f'count by (namespace) ({GATEWAY_HEALTH}{{job="{D.GATEWAY_JOB}", namespace="{NAMESPACE_PLACEHOLDER}"}} >= 0) '
    f"< {REPLICAS_PLACEHOLDER}", START_BUDGET, "critical",
    "{{ $labels.namespace }}: the gateway lists {{ $value }} of " + REPLICAS_PLACEHOLDER + " engine replicas",
    f"The Model Gateway's discovery has listed fewer engine pods than engine.replicas for {START_BUDGET}, "
    "longer than a model load: a replica's pod is gone (deleted, evicted, or its replacement cannot be "
    "scheduled) and serves nobody. Its exporter went with it, so no per-engine alert can see it.",
    ("`kubectl get pods -l app.kubernetes.io/component=engine`: Pending (no GPU free, a taint, a quota), "
     "CrashLoopBackOff, or missing?", "`kubectl describe pod` and the events: why it is not scheduled or not "
     "running.", "`smg_worker_health`: the gateway's view (-1: removed from its rotation)."),
    ("Free or add a GPU node, or lower engine.replicas to what the cluster holds (`helm upgrade`).",))
HELM_ONLY = (EXPORTER_ABSENT, GATEWAY_ABSENT, REPLICAS_MISSING)


def _le(bound: float) -> str:
    """A regex for a bucket's `le` as clients write it ("10.0", "0.25") or as Prometheus 3 may ("10")."""
    return "|".join(dict.fromkeys((f"{bound:g}", repr(float(bound)))))


def _sum_rate(selector: str, window: str) -> str:
    return f"sum by ({SLO_BY}) (rate({selector}[{window}]))"


def _profiles_ttft(profiles: list[Profile]) -> dict[str, float]:
    """Each profile's TTFT threshold, refused unless it is a bucket bound of its engine's histogram."""
    thresholds = {}
    for profile in profiles:
        buckets = adapter_for(profile).ttft_buckets
        if profile.slo.ttft_seconds not in buckets:
            raise UserError(f"profile {profile.name}: slo.ttft_seconds {profile.slo.ttft_seconds:g} is not a bucket "
                            f"of {profile.engine.kind}'s TTFT histogram; pick one of {', '.join(map(str, buckets))}")
        thresholds[profile.name] = profile.slo.ttft_seconds
    return thresholds


def bad_share(slo: str, window: str, profiles: list[Profile]) -> str:
    """PromQL: the share of `slo`'s bad events over `window`, per profile (no requests: no value)."""
    if slo == "ttft":
        default = Slo().ttft_seconds
        own = {name: t for name, t in _profiles_ttft(profiles).items() if t != default}
        good = [_sum_rate(f'{C.TTFT.bucket}{{profile="{name}", le=~"{_le(t)}"}}', window) for name, t in own.items()]
        others = f'profile!~"{"|".join(own)}", ' if own else ""
        good.append(_sum_rate(f'{C.TTFT.bucket}{{{others}le=~"{_le(default)}"}}', window))
        return f"1 - ({' or '.join(good)}) / {events(slo, window)}"
    total = events(slo, window)
    if slo == "gateway":
        answered = _sum_rate(f'{GATEWAY_UPSTREAM}{{job="{D.GATEWAY_JOB}", status_code!~"5.."}}', window)
        # Counted at different moments (a request as it arrives, its answer as it comes): kept within [0, 1].
        return f"clamp(1 - ({answered} or ({total}) * 0) / ({total}), 0, 1)"
    adapters = [ADAPTERS[kind] for kind in sorted(ADAPTERS)]  # engine: one term per engine (a profile runs one)
    bad = " or ".join(_sum_rate(a.requests_failed, window) for a in adapters if a.requests_failed)
    # A failure counter not created yet (until the first error) counts as no failures.
    return f"({bad} or ({total}) * 0) / ({total})"


def events(slo: str, window: str) -> str:
    """PromQL: the rate of `slo`'s events (users' requests) over `window`, per profile."""
    if slo == "ttft":
        return _sum_rate(f"{C.TTFT.name}_count", window)
    if slo == "gateway":
        return _sum_rate(f'{GATEWAY_REQUESTS}{{job="{D.GATEWAY_JOB}", path=~"{GATEWAY_USER_PATHS}"}}', window)
    return " or ".join(_sum_rate(ADAPTERS[kind].requests_finished, window) for kind in sorted(ADAPTERS))


def slo_rules(profiles: list[Profile]) -> list[dict[str, Any]]:
    """Each profile's error budgets, then every SLO's burn rate over every window of the burn alerts."""
    rules: list[dict[str, Any]] = [
        {"record": ERROR_BUDGET, "expr": f"vector({1 - getattr(profile.slo, field):.6g})",
         "labels": {"profile": profile.name, "slo": slo}}
        for profile in profiles for slo, field in SLO_TARGETS.items()]
    for slo in SLO_TARGETS:
        rules += [{"record": bad_share_record(window), "labels": {"slo": slo},
                   "expr": bad_share(slo, window, profiles)} for window in BURN_WINDOWS]
        rules += [{"record": events_record(window), "labels": {"slo": slo}, "expr": events(slo, window)}
                  for long, _, _ in (*PAGE_BURNS, *TICKET_BURNS) for window in (long,)]
    for slo, field in SLO_TARGETS.items():
        default_budget = f"{1 - getattr(Slo(), field):.6g}"
        for window in BURN_WINDOWS:
            share = f'{bad_share_record(window)}{{slo="{slo}"}}'
            # A profile not shipped here (no budget series) burns against the default target.
            rules.append({"record": burn_rate(window), "labels": {"slo": slo},
                          "expr": f'{share} / on (profile) group_left () {ERROR_BUDGET}{{slo="{slo}"}} '
                                  f"or {share} / {default_budget}"})
    return rules


def ttft_threshold(profile: Profile) -> float | None:
    """1.5x the slowest TTFT the profile's seed published, or None (the default threshold applies)."""
    published = [point.ttft_s for point in (profile.expected.sweep if profile.expected else []) if point.ttft_s]
    return round(TTFT_SWEEP_FACTOR * max(published), 1) if published else None


def threshold_rules() -> list[dict[str, Any]]:
    """Constant series per profile: its lowest published acceptance length and the floor the acceptance
    alert reads (a share of it, or the floor of a drafting profile without one), its TTFT threshold."""
    rules = []
    for profile in load_shipped():
        per_task = profile.expected.acceptance_length if profile.expected else {}
        if per_task and profile.expected:
            task = min(per_task, key=per_task.__getitem__)
            rules.append({"record": EXPECTED_ACCEPTANCE, "expr": f"vector({per_task[task]})",
                          "labels": {"profile": profile.name, "task": task, "engine": profile.engine.kind,
                                     "source": profile.expected.source}})
            rules.append({"record": ACCEPTANCE_FLOOR_RECORD,
                          "expr": f"vector({round(ACCEPTANCE_FRACTION * per_task[task], 3):g})",
                          "labels": {"profile": profile.name}})
        elif profile.draft:
            rules.append({"record": ACCEPTANCE_FLOOR_RECORD, "expr": f"vector({ACCEPTANCE_FLOOR:g})",
                          "labels": {"profile": profile.name}})
        ttft = ttft_threshold(profile)
        if ttft is not None and profile.expected:
            rules.append({"record": TTFT_THRESHOLD, "expr": f"vector({ttft})",
                          "labels": {"profile": profile.name, "source": profile.expected.source}})
    return rules


def recording_rules() -> list[dict[str, Any]]:
    """The rules the alerts alone read: each replica's own acceptance level, the SLOs' burn rates."""
    median = {"record": ACCEPTANCE_MEDIAN,
              "expr": f"quantile_over_time(0.5, {ACCEPTANCE_5M}[{ACCEPTANCE_OWN_WINDOW}])"}
    return [median, *slo_rules(load_shipped())]


def alert_rules(helm: bool = False) -> dict[str, Any]:
    """The alert group; for Helm also the discovery checks (the gateway's in a group of its own, which the
    chart keeps only with the gateway), namespace placeholders in place."""
    groups = [{"name": "ornith-alerts", "rules": [alert.rule(helm) for alert in ALERTS]}]
    if helm:
        groups += [{"name": "ornith-exporter-discovery", "rules": [EXPORTER_ABSENT.rule(helm)]},
                   {"name": GATEWAY_DISCOVERY_GROUP, "rules": [GATEWAY_ABSENT.rule(helm), REPLICAS_MISSING.rule(helm)]}]
    return {"groups": groups}


# An alert's text reads its labels and value through Prometheus' templates; a runbook is read without them.
_TEMPLATE = re.compile(r"\{\{\s*(?:\$labels\.(\w+)|[^}]*?\$value\b[^}]*?)\s*\}\}")


def untemplated(text: str) -> str:
    """`{{ $labels.target }}` as `<target>`, `{{ $value | ... }}` as `<value>`: what the alert names in its place."""
    return _TEMPLATE.sub(lambda m: f"`<{m[1] or 'value'}>`", text)


# Where to look and what to run, per deployment path: the same services on each (`<profile>`, `<namespace>` and
# `<release>` are the operator's; replicas are engine-0, engine-1, ... in compose).
COMMANDS = (
    ("compose (`ornith-stack up`)",
     f"`ornith-stack status`, `ornith-stack logs {D.ENGINE_SERVICE}` (or `{D.GATEWAY_SERVICE}`, "
     f"`{D.EXPORTER_SERVICE}`)",
     f"`docker compose -p ornith-<profile> -f compose/<profile>.yml restart {D.ENGINE_SERVICE}`; after a change, "
     "`ornith-stack up` (replicas one at a time)"),
    ("Helm",
     "`kubectl -n <namespace> get pods -l app.kubernetes.io/instance=<release>`, "
     f"`kubectl -n <namespace> logs deploy/<release>-ornith-{D.ENGINE_SERVICE}`",
     f"`kubectl -n <namespace> rollout restart deploy/<release>-ornith-{D.ENGINE_SERVICE}` (drains one pod at a "
     "time)"),
    ("Ansible host",
     "`systemctl status ornith-<profile>`, `journalctl -u ornith-<profile>`, "
     f"`docker compose -p ornith-<profile> logs {D.ENGINE_SERVICE}` in /opt/ornith-stack",
     "`systemctl restart ornith-<profile>`; after a change, the playbook again"),
)


def runbook(alert: Alert) -> str:
    steps = "\n".join(f"{i}. {untemplated(step)}" for i, step in enumerate(alert.check, 1))
    fixes = "\n".join(f"- {untemplated(fix)}" for fix in alert.fix)
    commands = "\n".join(f"| {where} | {look} | {restart} |" for where, look, restart in COMMANDS)
    return (f"# {alert.name}\n\nSeverity: **{alert.severity}**. Fires when, for {alert.duration}:\n\n"
            f"```promql\n{alert.expr}\n```\n\n## Meaning\n\n{untemplated(alert.description)}\n\n"
            f"Dashboard: Grafana's *Ornith: speculative decoding overview*, `/d/{D.OVERVIEW_DASHBOARD_UID}` "
            f"(compose: http://127.0.0.1:{D.GRAFANA_PORT}/d/{D.OVERVIEW_DASHBOARD_UID}).\n\n"
            f"## Check\n\n{steps}\n\n## Fix\n\n{fixes}\n\n"
            "## Commands\n\n| path | look | restart |\n|---|---|---|\n"
            f"{commands}\n")


def files(root: Path) -> Iterator[GeneratedFile]:
    for alert in (*ALERTS, *HELM_ONLY):
        yield GeneratedFile(f"{RUNBOOK_DIR}/{alert.name}.md", SOURCE,
                            lambda alert=alert: with_header(SOURCE, runbook(alert), "markdown"))  # type: ignore[misc]
