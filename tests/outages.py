"""The outages of issue 33 as promtool cases: each pages once, at its severity, by a stated minute; a
planned restart and a traffic lull page nobody.

A scenario is minute-by-minute input series (what the exporter, the engines and the gateway would
expose), the alert that must be the one page (or ticket) by `by` minutes, the alerts that fire beside it
and that Alertmanager inhibits (tests check the inhibitions cover them), and minutes at which nothing of
severity critical or warning fires. Checks read Prometheus' ALERTS series, so they assert which alerts
fire, at which severity and with which labels, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Values = list[float | None | str]  # one value a minute; None: no sample; STALE: a scrape that failed
STALE = "stale"  # the marker Prometheus writes when a scrape fails: the series ends at once
HISTORY = 180  # minutes of steady acceptance before a decay
# Issue 44: six hours of steady traffic before an outage, so that every window of the page rules (6h the
# longest) holds real history and the time to page is the one production sees.
SIX_HOURS = 360
PAGING = 'ALERTS{alertstate="firing", severity=~"critical|warning"}'


@dataclass(frozen=True)
class Fired:
    alert: str
    severity: str
    labels: dict[str, str]

    def sample(self) -> dict[str, Any]:
        labels = {"alertname": self.alert, "alertstate": "firing", **self.labels, "severity": self.severity}
        return {"labels": "ALERTS{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": 1}


@dataclass(frozen=True)
class Outage:
    name: str
    series: dict[str, Values]
    page: Fired | None  # None: nothing may page (a planned restart, a lull)
    by: int  # minutes: the page fires by then ...
    quiet: tuple[int, ...]  # ... and nothing critical or warning fires at these minutes
    inhibited: tuple[Fired, ...] = ()  # firing beside the page at `late`, inhibited by Alertmanager
    late: int | None = None
    beside: tuple[Fired, ...] = ()  # firing beside the page already at `by`, inhibited by Alertmanager
    # At every evaluation (`every` seconds: the shipped Prometheus' interval) from `by` to the input's
    # end some critical alert with these labels fires (no evaluation where the outage has no alert) ...
    covered: dict[str, str] | None = None
    every: int = 60
    # ... and at these minutes exactly these alerts fire (one of them not inhibited by another: one page).
    phases: tuple[tuple[int, tuple[Fired, ...]], ...] = ()
    # What `quiet` forbids: pages and tickets; "critical" for noise that may be a ticket by design but no page.
    quiet_severity: str = "critical|warning"

    def test(self) -> dict[str, Any]:
        length = max(len(v) for v in self.series.values())
        silent = PAGING.replace("critical|warning", self.quiet_severity)
        checks = [{"expr": silent, "eval_time": f"{m}m", "exp_samples": []} for m in self.quiet]
        if self.covered:
            about = ", ".join(f'{k}="{v}"' for k, v in self.covered.items())
            checks += [{"expr": f'max(ALERTS{{alertstate="firing", severity="critical", {about}}})',
                        "eval_time": f"{s}s", "exp_samples": [{"labels": "{}", "value": 1}]}
                       for s in range(self.by * 60, (length - 1) * 60 + 1, self.every)]
        checks += [{"expr": PAGING, "eval_time": f"{m}m", "exp_samples": [f.sample() for f in fired]}
                   for m, fired in self.phases]
        if self.page:
            checks.append({"expr": PAGING, "eval_time": f"{self.by}m",
                           "exp_samples": [f.sample() for f in (self.page, *self.beside)]})
        if self.late is not None:
            fired = [f for f in (self.page, *self.inhibited) if f]
            checks.append({"expr": PAGING, "eval_time": f"{self.late}m", "exp_samples": [f.sample() for f in fired]})
        assert all(_seconds(c["eval_time"]) < length * 60 for c in checks), f"{self.name}: a check past the input"
        return {"name": self.name, "interval": "1m",
                "input_series": [{"series": s, "values": _values(v)} for s, v in self.series.items()],
                "promql_expr_test": checks}


def _seconds(duration: str) -> int:
    return int(duration[:-1]) * (60 if duration.endswith("m") else 1)


def _values(values: Values) -> str:
    return " ".join("_" if v is None else v if isinstance(v, str) else f"{v:g}" for v in values)


def counter(per_s: Sequence[float]) -> Values:
    """A counter's value each minute from its rate (per second) during each minute."""
    total, out = 0.0, [0.0]
    for rate in per_s:
        total += rate * 60
        out.append(round(total, 3))
    return out


def steady(value: float, minutes: int) -> Values:
    return [value] * minutes


def then(*parts: tuple[float, int]) -> list[float]:
    """(value, minutes), ...: a piecewise-constant sequence."""
    return [value for value, minutes in parts for _ in range(minutes)]


def gauge(*parts: tuple[float | None, int]) -> Values:
    return [value for value, minutes in parts for _ in range(minutes)]


GPU96 = 'profile="gpu96"'
GATEWAY = f'job="gateway", instance="gateway:29000", target="http://gateway:29000", {GPU96}'
REPLICAS = ("http://replica-0:30000", "http://replica-1:30000")


def _engines_up(profile: str, targets: Sequence[str], values: Values) -> dict[str, Values]:
    return {f'ornith_engine_up{{target="{t}", profile="{profile}"}}': values for t in targets}


CHAT = 'method="POST", path="/v1/chat/completions"'
PROBES = 'method="GET", path="/readiness"'


def _gateway(ok_per_s: list[float], failed_per_s: list[float], health: Values, up: Values,
             upstream_failed: str = "") -> dict[str, Values]:
    """The gateway's counters as smg 0.3.2 keeps them: users' requests by path (health probes too, one every
    5 s, always answered), the workers' answers by status; failed requests are the gateway's own 503 (no
    healthy worker: no answer from upstream) unless `upstream_failed` names the workers' status."""
    chat = [ok + bad for ok, bad in zip(ok_per_s, failed_per_s, strict=True)]
    series = {f'up{{{GATEWAY}}}': up,
              f'smg_http_requests_total{{{GATEWAY}, {CHAT}}}': counter(chat),
              f'smg_http_requests_total{{{GATEWAY}, {PROBES}}}': counter([0.2] * len(chat)),
              f'smg_http_responses_total{{{GATEWAY}, status_code="200", error_code=""}}':
                  counter([ok + 0.2 for ok in ok_per_s]),
              f'smg_router_upstream_responses_total{{{GATEWAY}, router_type="http", status_code="200", error_code=""}}':
                  counter(ok_per_s)}
    if upstream_failed:
        series[f'smg_router_upstream_responses_total{{{GATEWAY}, router_type="http", status_code="{upstream_failed}", '
               'error_code=""}'] = counter(failed_per_s)
    for replica in REPLICAS:
        series[f'smg_worker_health{{{GATEWAY}, worker="{replica}"}}'] = health
    return series


def gateway_down() -> Outage:
    # Up for an hour, then gone: its own series stop (Prometheus cannot scrape it), the engines are fine.
    scraped: Values = gauge((1, 61), (None, 60))
    series = {**_engines_up("gpu96", REPLICAS, steady(1, 121)),
              f'up{{{GATEWAY}}}': gauge((1, 61), (0, 60)),
              f'smg_http_requests_total{{{GATEWAY}, {CHAT}}}': counter(then((10, 60)))[:61] + [None] * 60,
              f'smg_router_upstream_responses_total{{{GATEWAY}, router_type="http", status_code="200", error_code=""}}':
                  counter(then((10, 60)))[:61] + [None] * 60}
    series.update({f'smg_worker_health{{{GATEWAY}, worker="{r}"}}': scraped for r in REPLICAS})
    target_down = Fired("OrnithTargetDown", "warning", dict(_labels(GATEWAY)))
    return Outage("the gateway down, engines fine", series,
                  Fired("OrnithGatewayDown", "critical", dict(_labels(GATEWAY))), by=67, quiet=(30, 60, 64),
                  beside=(target_down,))


def workers_unhealthy() -> Outage:
    # The gateway answers, its health checks fail every worker after an hour: every request a 503.
    series = {**_engines_up("gpu96", REPLICAS, steady(1, 121)),
              **_gateway(then((10, 60), (0, 60)), then((0, 60), (10, 60)), gauge((1, 61), (0, 60)),
                         steady(1, 121))}
    burn = {"profile": "gpu96", "slo": "gateway"}
    fast = Fired("OrnithErrorBudgetBurn", "critical", burn)
    return Outage("every worker unhealthy at the gateway, engines fine", series,
                  Fired("OrnithNoReadyReplicas", "critical", {"profile": "gpu96"}), by=70, quiet=(30, 60, 64),
                  beside=(fast,), inhibited=(fast, Fired("OrnithErrorBudgetBurnSlow", "warning", burn)), late=90)


def gateway_5xx() -> Outage:
    # Workers healthy, engines fine, the gateway answers 500 to everything after an hour.
    series = {**_engines_up("gpu96", REPLICAS, steady(1, 181)),
              **_gateway(then((10, 60), (0, 120)), then((0, 60), (10, 120)), steady(1, 181), steady(1, 181),
                         upstream_failed="500")}
    burn = {"profile": "gpu96", "slo": "gateway"}
    return Outage("100% 5xx at the gateway, workers healthy, engines fine", series,
                  Fired("OrnithErrorBudgetBurn", "critical", burn), by=75, quiet=(30, 60, 65),
                  inhibited=(Fired("OrnithErrorBudgetBurnSlow", "warning", burn),), late=150)


def engine_errors() -> Outage:
    # vLLM (spark) finishing every request with finished_reason="error", 10/s for an hour, no canary.
    engine = 'job="engine", target="http://spark:8000", profile="spark", model_name="ornith"'
    series = {**_engines_up("spark", ("http://spark:8000",), steady(1, 121)),
              f'vllm:request_success_total{{{engine}, finished_reason="stop"}}': counter(then((10, 60), (0, 60))),
              f'vllm:request_success_total{{{engine}, finished_reason="error"}}': counter(then((0, 60), (10, 60)))}
    return Outage("every request failing at the engine (10/s finished_reason=error), no canary", series,
                  Fired("OrnithErrorBudgetBurn", "critical", {"profile": "spark", "slo": "engine"}), by=75,
                  quiet=(30, 60, 65))


def _refusing(up: Values, url: str = "http://engine:30000", profile: str = "a100x2") -> dict[str, Values]:
    target = f'target="{url}", profile="{profile}"'
    refused = counter([4 / 60 if v == 0 else 0 for v in up[1:]])  # the exporter's scrapes, 15 s apart
    return {**_engines_up(profile, (url,), up),
            f'ornith_exporter_scrape_errors_total{{{target}, reason="connect"}}': refused}


def engine_refusing() -> Outage:
    # The single compose engine: up for an hour, then refusing connections (info OrnithEngineStarting).
    return Outage("the single compose engine refusing connections", _refusing(gauge((1, 61), (0, 60))),
                  Fired("OrnithNoReadyReplicas", "critical", {"profile": "a100x2"}), by=67, quiet=(30, 60, 64),
                  inhibited=(Fired("OrnithEngineDownLong", "critical",
                                   {"target": "http://engine:30000", "profile": "a100x2"}),), late=90)


def engine_hung(every: int) -> Outage:
    # One of two replicas hangs after an hour (it accepts connections, every scrape times out) and stays
    # hung: OrnithEngineDown pages, OrnithEngineDownLong takes over at the start budget (20 minutes) and
    # inhibits it. The other replica serves, so no profile-wide alert explains it.
    hung, healthy = REPLICAS
    target = f'target="{hung}", profile="gpu96"'
    series = {**_engines_up("gpu96", (hung,), gauge((1, 61), (0, 60))),
              **_engines_up("gpu96", (healthy,), steady(1, 121)),
              f'ornith_exporter_scrape_errors_total{{{target}, reason="timeout"}}':
                  counter([0.0] * 60 + [4 / 60] * 60)}
    labels = {"target": hung, "profile": "gpu96"}
    down, long = Fired("OrnithEngineDown", "critical", labels), Fired("OrnithEngineDownLong", "critical", labels)
    return Outage("one replica hung for an hour: always an alert, one page at a time", series, down, by=63,
                  quiet=(30, 60), covered=labels, every=every,
                  phases=((70, (down,)), (81, (down, long)), (90, (long,)), (120, (long,))))


def planned_restart_in_a_lull() -> Outage:
    # A planned restart of the single engine (3 minutes refusing connections) while nobody sends requests:
    # counters flat, so every SLO share is empty, and the outage is shorter than a page's wait.
    engine = 'job="engine", target="http://engine:30000", profile="a100x2", model_name="ornith"'
    series = {**_refusing(gauge((1, 61), (0, 3), (1, 116))),
              f'sglang:num_requests_total{{{engine}}}': steady(500, 180),
              'ornith_time_to_first_token_seconds_count{target="http://engine:30000", profile="a100x2"}':
                  steady(500, 180)}
    return Outage("a planned 3-minute restart in a traffic lull", series, None, by=0,
                  quiet=(30, 61, 62, 63, 64, 65, 66, 70, 90, 120, 179))


def rolling_change() -> Outage:
    """`up`'s rolling change on a GPU host: replica 0 of two leaves the gateway's rotation (smg keeps its
    worker's health series at -1 until it is back), drains, restarts for 15 minutes (refusing connections:
    starting) and comes back, while replica 1 serves every request. Nobody is paged (a sum of the health
    series, 1 + -1, read as "no healthy worker" and paged five minutes into every roll)."""
    out, serving = REPLICAS
    series = {**_refusing(gauge((1, 63), (0, 15), (1, 43)), out, "gpu96"),
              **_engines_up("gpu96", (serving,), steady(1, 121)),
              **_gateway(steady(10, 120), steady(0, 120), steady(1, 121), steady(1, 121))}
    series[f'smg_worker_health{{{GATEWAY}, worker="{out}"}}'] = gauge((1, 61), (-1, 18), (1, 42))
    return Outage("a rolling change: one of two replicas out of rotation for 18 minutes", series, None, by=0,
                  quiet=(30, 60, 62, 66, 70, 75, 78, 80, 90, 120))


def replica_gone_from_discovery(namespace: str) -> Outage:
    """Kubernetes (gateway, engine.replicas 2): one engine pod deleted after an hour and its replacement never
    scheduled. Its sidecar exporter goes with it (no engine series says anything); the gateway's discovery
    drops the worker (smg keeps it at -1). A page once the start budget (20 minutes) has passed."""
    gateway = f'job="gateway", namespace="{namespace}", instance="10.0.0.9:29000"'
    gone, serving = REPLICAS
    series = {f"up{{{gateway}}}": steady(1, 121),
              f'up{{job="ornith-exporter", namespace="{namespace}", instance="10.0.0.7:9400"}}': steady(1, 121),
              f'smg_worker_health{{{gateway}, worker="{serving}"}}': steady(1, 121),
              f'smg_worker_health{{{gateway}, worker="{gone}"}}': gauge((1, 61), (-1, 60))}
    return Outage("an engine pod gone from the gateway's discovery (Kubernetes)", series,
                  Fired("OrnithReplicasMissing", "critical", {"namespace": namespace}), by=83, quiet=(30, 60, 75))


def _acceptance(profile: str, levels: list[float]) -> dict[str, Values]:
    """A replica's spec counters: 10 verification steps a second at acceptance `levels` (one a minute)."""
    labels = f'target="http://{profile}:30000", profile="{profile}", engine="sglang", model="m"'
    return {f"ornith_spec_verify_steps_total{{{labels}}}": counter([10.0] * len(levels)),
            f"ornith_spec_accepted_tokens_total{{{labels}}}": counter([10 * (a - 1) for a in levels])}


def acceptance_decay(start: float) -> Outage:
    # Three hours at `start` (the replica's median over its last day is the level it held most of it: a
    # day of history adds nothing but promtool time), then a linear decay of 30% over 2 hours (a100x2
    # publishes 6.1: from 6.1 the published floor, 3.66, is never reached).
    decay = [start * (1 - 0.3 * m / 120) for m in range(1, 121)]
    levels = [start] * HISTORY + decay + [decay[-1]] * 10
    labels = {"target": "http://a100x2:30000", "profile": "a100x2", "engine": "sglang", "model": "m"}
    return Outage(f"acceptance decaying 30% over 2 hours from {start:g}", _acceptance("a100x2", levels),
                  Fired("OrnithSpecAcceptanceLow", "warning", labels), by=HISTORY + 100,
                  quiet=(HISTORY, HISTORY + 60, HISTORY + 95))


def acceptance_collapse_unpublished() -> Outage:
    # gb300x2 publishes no acceptance: a collapse to 1.2 tokens/step for 2 hours.
    labels = {"target": "http://gb300x2:30000", "profile": "gb300x2", "engine": "sglang", "model": "m"}
    return Outage("gb300x2 (no published figure) collapsed to 1.2 tokens/step", _acceptance("gb300x2", [1.2] * 121),
                  Fired("OrnithSpecAcceptanceLow", "warning", labels), by=20, quiet=(10,))


def exporter_gone_from_discovery(namespace: str) -> Outage:
    # Kubernetes: the exporter's pods and Service deleted; its target, and its `up`, vanish.
    exporter = f'job="ornith-exporter", namespace="{namespace}", instance="10.0.0.7:9400"'
    series = {f"up{{{exporter}}}": gauge((1, 31), (None, 30)),
              **_engines_up("gpu96", REPLICAS, gauge((1, 31), (None, 30)))}
    return Outage("the exporter gone from service discovery (Kubernetes)", series,
                  Fired("OrnithExporterAbsent", "critical", {"job": "ornith-exporter", "namespace": namespace}),
                  by=45, quiet=(30, 35))


def _user_gateway(ok_per_s: list[float], failed_per_s: list[float]) -> dict[str, Values]:
    """One replica behind the gateway, healthy throughout; failed requests answered 500 by the worker."""
    minutes = len(ok_per_s) + 1
    return {**_engines_up("gpu96", REPLICAS[:1], steady(1, minutes)),
            **_gateway(ok_per_s, failed_per_s, steady(1, minutes), steady(1, minutes), upstream_failed="500")}


def gateway_failing_at_one_request_a_minute() -> Outage:
    """Issue 44's row "gateway up, every request failing, 1 request/min" (was +45m compose, +3h38m Helm: the
    health probes, 12 a minute, counted as successes). Users' requests only: a page within 15 minutes."""
    series = _user_gateway(then((1 / 60, SIX_HOURS), (0, 30)), then((0, SIX_HOURS), (1 / 60, 30)))
    return Outage("issue 44: the gateway failing every request at 1 request/min (6 h of history)", series,
                  Fired("OrnithErrorBudgetBurn", "critical", {"profile": "gpu96", "slo": "gateway"}),
                  by=SIX_HOURS + GATEWAY_FAILING_PAGE_MINUTES, quiet=(SIX_HOURS - 1, SIX_HOURS + 5))


GATEWAY_FAILING_PAGE_MINUTES = 15


def one_failure_at_six_requests_an_hour() -> Outage:
    """Issue 44's noise row: vLLM (spark) serving 6 requests an hour, one of them failing (a 17x burn over the
    hour, 100% over 5 minutes: was a page): below the minimum traffic in the hour, nothing pages. (Over the
    days, one failure in 42 requests is 2.4% against a 1% budget: the slow-burn ticket may say so.)"""
    engine = 'job="engine", target="http://spark:8000", profile="spark", model_name="ornith"'
    failed = then((0, SIX_HOURS + 30), (1 / 60, 1), (0, 149))
    series = {**_engines_up("spark", ("http://spark:8000",), steady(1, len(failed) + 1)),
              f'vllm:request_success_total{{{engine}, finished_reason="stop"}}':
                  counter(then((1 / 600, SIX_HOURS + 30), (0, 10), (1 / 600, 140))),  # the failed one of 6
              f'vllm:request_success_total{{{engine}, finished_reason="error"}}': counter(failed)}
    return Outage("issue 44: one failed request at 6 requests/hour pages nobody", series, None,
                  by=0, quiet=tuple(range(SIX_HOURS + 30, SIX_HOURS + 180, 5)), quiet_severity="critical")


def one_abort_call_in_an_idle_hour() -> Outage:
    """Issue 44's noise row: SGLang idle (its finished counter flat), one `abort_request` call: SGLang counts abort
    calls, not failed requests (was an +Inf burn and a page); nothing pages or tickets."""
    engine = 'job="engine", target="http://engine:30000", profile="a100x2", model_name="ornith"'
    minutes = SIX_HOURS + 120
    aborts: Values = gauge((3, SIX_HOURS + 10), (4, minutes - SIX_HOURS - 10))  # three abort calls days ago
    series = {**_engines_up("a100x2", ("http://engine:30000",), steady(1, minutes)),
              f'sglang:num_requests_total{{{engine}}}': steady(500, minutes),
              f'sglang:num_aborted_requests_total{{{engine}}}': aborts}
    return Outage("issue 44: one abort call in an idle hour pages nobody", series, None, by=0,
                  quiet=tuple(range(SIX_HOURS + 10, minutes, 5)))


EXPORTER = 'job="ornith-exporter", instance="exporter:9400"'
EXPORTER_DIES = 70  # minutes: a replica hung since minute 60 is paged (OrnithEngineDown) when the exporter dies


def exporter_dies_while_an_engine_is_hung() -> Outage:
    """Issue 44's row "exporter dead" (was: OrnithExporterDown at +2m and every other alert resolved, the pager
    told "resolved" for an engine still hung). The exporter pages once; the hung replica stays paged, and
    OrnithEngineDownLong still takes over at its start budget, from the state last seen."""
    hung, healthy = REPLICAS
    after = 120 - EXPORTER_DIES
    gone: Values = [STALE] + [None] * (after - 1)  # the exporter's scrape fails: its series end at once
    series = {f"up{{{EXPORTER}}}": gauge((1, EXPORTER_DIES), (0, after)),
              **_engines_up("gpu96", (hung,), gauge((1, 61), (0, EXPORTER_DIES - 61)) + gone),
              **_engines_up("gpu96", (healthy,), steady(1, EXPORTER_DIES) + gone),
              f'ornith_exporter_scrape_errors_total{{target="{hung}", profile="gpu96", reason="timeout"}}':
                  counter([0.0] * 60 + [4 / 60] * (EXPORTER_DIES - 61)) + gone}
    labels = {"target": hung, "profile": "gpu96"}
    down, long = Fired("OrnithEngineDown", "critical", labels), Fired("OrnithEngineDownLong", "critical", labels)
    exporter = Fired("OrnithExporterDown", "critical", dict(_labels(EXPORTER)))
    return Outage("issue 44: the exporter dies while a replica is hung", series, exporter, by=EXPORTER_DIES + 3,
                  quiet=(30, 60), beside=(down,),
                  phases=((65, (down,)), (EXPORTER_DIES + 10, (down, exporter)), (85, (down, long, exporter)),
                          (110, (long, exporter))))


def _labels(text: str) -> list[tuple[str, str]]:
    return [(k.strip(), v.strip().strip('"')) for k, v in (part.split("=", 1) for part in text.split(", "))]


COMPOSE: tuple[Callable[[], Outage], ...] = (
    gateway_down, workers_unhealthy, gateway_5xx, engine_errors, engine_refusing, planned_restart_in_a_lull, rolling_change,
    lambda: acceptance_decay(6.1), lambda: acceptance_decay(5.0), acceptance_collapse_unpublished)


# Issue 44's outage table, a case per row proven so far (tests/unit/test_alert_outages.py).
ISSUE_44: tuple[Callable[[], Outage], ...] = (
    gateway_failing_at_one_request_a_minute, one_failure_at_six_requests_an_hour, one_abort_call_in_an_idle_hour,
    exporter_dies_while_an_engine_is_hung)


def promtool_file(outages: Sequence[Outage], rule_files: Sequence[str], evaluation: str = "1m") -> dict[str, Any]:
    return {"rule_files": list(rule_files), "evaluation_interval": evaluation, "tests": [o.test() for o in outages]}
