"""A small Prometheus HTTP API client, and a fleet's servers from Prometheus' scrape targets.

`PrometheusClient(url)` asks `/api/v1/targets`, `/api/v1/query` (instant) and `/api/v1/query_range`
through tuner.backends.http (httpx, every read bounded by size and deadline). We do not use
prometheus-api-client: it pulls pandas, numpy and matplotlib into the operator's install for three
GETs whose JSON shape is documented and stable (prometheus.io/docs/prometheus/latest/querying/api/).

`--selector '{job="sglang"}'` is matched against each target's labels (after relabelling: what a
PromQL query sees); a server's URL is its `scrapeUrl` minus `/metrics`. `target_state` says, from
Prometheus alone, whether a target is up: a target whose last scrape failed, or whose last scrape is
older than one scrape interval plus its timeout, is gone.

Prometheus down, slow, or answering something that is not its API is one PrometheusError line (rc 1);
a bad selector or URL is rc 2. Must not contact the targets themselves (tuner.fleet.followers does,
to tell servers from follower nodes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable
from urllib.parse import urlsplit

from tuner.backends.http import BadAnswer, HttpClient, ServerError, ServerSlow, ServerUnreachable
from tuner.core.redact import redact_url
from tuner.core.text import terminal_safe
from tuner.fleet.members import Member, default_name, unique_names
from tuner.fleet.urls import UrlError, checked_url

TIMEOUT_S = 2.0          # one socket operation
DEADLINE_S = 5.0         # one whole answer: a query over a fleet's series is small
MAX_TARGETS = 4096
MAX_SERIES = 100_000     # one answer's series; a query that matches more is the caller's mistake


class PrometheusError(ValueError):
    """Prometheus cannot answer what was asked (one line, password-free); rc 2 for our inputs."""

    def __init__(self, text: str, rc: int = 1) -> None:
        super().__init__(text)
        self.rc = rc


# -- selectors ------------------------------------------------------------------------------------------

_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True)
class Matcher:
    """One `name op "value"` of a selector; regexes are anchored, as in PromQL."""

    name: str
    op: str
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.name, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None
        return hit if self.op == "=~" else not hit


def parse_selector(text: str | None) -> list[Matcher]:
    """`{job="sglang",instance=~"10\\..*"}` (braces optional) as matchers; [] for none.
    PrometheusError (rc 2) naming what is wrong."""
    if text is None or not text.strip():
        return []
    body = text.strip()
    if body.startswith("{"):
        if not body.endswith("}"):
            raise PrometheusError(f"--selector {terminal_safe(text)[:80]!r}: no closing '}}'", 2)
        body = body[1:-1]
    out: list[Matcher] = []
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None or m.end() == pos:
            raise PrometheusError(f"--selector {terminal_safe(text)[:80]!r}: expected label=\"value\" "
                                  f"(=, !=, =~, !~) at {terminal_safe(body[pos:pos + 20])!r}", 2)
        value = re.sub(r'\\(.)', r'\1', m.group(3))
        if m.group(2) in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as e:
                raise PrometheusError(f"--selector: {m.group(1)}{m.group(2)}: not a regex ({e})", 2) from None
        out.append(Matcher(m.group(1), m.group(2), value))
        pos = m.end()
    return out


def selected(labels: dict[str, str], matchers: Iterable[Matcher]) -> bool:
    return all(m.matches(labels) for m in matchers)


# -- targets --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One active scrape target as Prometheus reports it."""

    scrape_url: str
    labels: dict[str, str] = field(default_factory=dict)
    health: str = "unknown"            # "up", "down", "unknown"
    last_error: str = ""
    last_scrape: float | None = None   # Unix seconds
    interval_s: float | None = None
    timeout_s: float | None = None

    @property
    def instance(self) -> str:
        return self.labels.get("instance", "")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def parse_duration(text: Any) -> float | None:
    """Prometheus' duration text (`15s`, `1m30s`, `500ms`) in seconds; None when it is not one."""
    if not isinstance(text, str) or not text:
        return None
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    return total if pos == len(text) else None


def parse_time(text: Any) -> float | None:
    """RFC 3339 (Prometheus writes nanoseconds and `Z`) in Unix seconds; None for the zero time or junk."""
    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    t = re.sub(r"(\.\d{6})\d+", r"\1", text.strip())      # datetime keeps microseconds only
    try:
        return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _labels(x: Any) -> dict[str, str]:
    if not isinstance(x, dict):
        return {}
    return {str(k): str(v) for k, v in x.items() if isinstance(k, str) and isinstance(v, (str, int, float))}


def parse_targets(data: Any) -> list[Target]:
    """`data` of /api/v1/targets as Targets; PrometheusError when it is not that shape."""
    if not isinstance(data, dict) or not isinstance(data.get("activeTargets"), list):
        raise PrometheusError("GET /api/v1/targets: no activeTargets list (is this Prometheus?)")
    active = data["activeTargets"]
    if len(active) > MAX_TARGETS:
        raise PrometheusError(f"GET /api/v1/targets lists {len(active)} targets (at most {MAX_TARGETS})")
    out = []
    for t in active:
        if not isinstance(t, dict) or not isinstance(t.get("scrapeUrl"), str):
            continue              # not a target we could name a server by; Prometheus always sends one
        health = t.get("health") if t.get("health") in ("up", "down", "unknown") else "unknown"
        out.append(Target(t["scrapeUrl"], _labels(t.get("labels")), health,
                          terminal_safe(str(t.get("lastError") or ""))[:200], parse_time(t.get("lastScrape")),
                          parse_duration(t.get("scrapeInterval")), parse_duration(t.get("scrapeTimeout"))))
    return out


def server_url(scrape_url: str) -> str:
    """The server's base URL: the scrape URL minus `/metrics`. UrlError when the target scrapes
    another path or carries a query (then it is not a server's /metrics)."""
    parts = urlsplit(scrape_url)
    if parts.path.rstrip("/") != "/metrics" or parts.query:
        shown = terminal_safe(redact_url(scrape_url))[:120]
        raise UrlError(f"scrapes {shown!r}, not a server's /metrics")
    return checked_url(f"{parts.scheme}://{parts.netloc}")


def target_state(target: Target, now: float) -> tuple[str, str]:
    """("connected" | "gone" | "connecting", why) from Prometheus alone, at Unix time `now`: a failed
    last scrape is gone at once; a last scrape older than one interval plus its timeout is gone too
    (Prometheus stopped reaching it, or stopped scraping)."""
    if target.health == "down":
        return "gone", f"Prometheus: {target.last_error or 'last scrape failed'}"
    if target.last_scrape is None:
        return "connecting", "Prometheus has not scraped it yet"
    limit = (target.interval_s or 0.0) + (target.timeout_s or 0.0)
    age = now - target.last_scrape
    if limit > 0 and age > limit:
        return "gone", f"Prometheus: last scrape {age:.1f} s ago (interval + timeout {limit:g} s)"
    return ("connected", "") if target.health == "up" else ("connecting", "")


def members_of(targets: Iterable[Target], matchers: Iterable[Matcher]) -> tuple[list[Member], list[str]]:
    """The selected targets as Members (named host:port, Prometheus labels kept), and one line per
    selected target that cannot be a server (it scrapes another path)."""
    matchers = list(matchers)
    members, skipped = [], []
    seen: set[str] = set()
    for t in targets:
        if not selected(t.labels, matchers):
            continue
        try:
            url = server_url(t.scrape_url)
        except UrlError as e:
            skipped.append(f"target {terminal_safe(t.instance or t.scrape_url)[:80]}: {e}")
            continue
        if url in seen:       # one server scraped by two jobs is one server
            continue
        seen.add(url)
        members.append(Member(default_name(url), url, source="prometheus", labels=dict(t.labels)))
    return unique_names(members), skipped


# -- the client -------------------------------------------------------------------------------------------

def _where(url: str) -> str:
    return f"Prometheus {terminal_safe(redact_url(url))}"


class PrometheusClient:
    """The three API calls the fleet needs. Safe to share between threads (HttpClient is)."""

    def __init__(self, url: str, *, timeout: float = TIMEOUT_S, deadline: float = DEADLINE_S) -> None:
        try:
            self.url = checked_url(url)
        except UrlError as e:
            raise PrometheusError(f"--prometheus: {e}", 2) from None
        self.where = _where(self.url)
        try:
            self._http = HttpClient(self.url, None, timeout=timeout, deadline=deadline)
        except ServerError as e:
            raise PrometheusError(f"{self.where}: {e}", 2) from None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "PrometheusClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            body = self._http.get_json(path, params=params)
        except ServerUnreachable as e:
            raise PrometheusError(f"{self.where} is down: {e}") from None
        except ServerSlow as e:
            raise PrometheusError(f"{self.where} is too slow: {e}") from None
        except BadAnswer as e:
            api_error = _api_error(e.body)
            if api_error:
                raise PrometheusError(f"{self.where}: {path}: {api_error}") from None
            raise PrometheusError(f"{self.where} is not a Prometheus API: {e}") from None
        except ServerError as e:
            raise PrometheusError(f"{self.where}: {e}") from None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            raise PrometheusError(f"{self.where}: {path} is not a Prometheus API answer (no status)")
        if body["status"] == "error":
            raise PrometheusError(f"{self.where}: {path}: {_api_error(body) or 'error'}")
        return body.get("data")

    def targets(self) -> list[Target]:
        return parse_targets(self._get("/api/v1/targets", {"state": "active"}))

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant vector: (labels with __name__ where kept, value) per series."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return parse_vector(self._get("/api/v1/query", params), self.where)

    def query_range(self, promql: str, start: float, end: float, step: float
                    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range matrix: (labels, [(unix t, value), ...]) per series."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return parse_matrix(self._get("/api/v1/query_range", params), self.where)


def _api_error(body: Any) -> str:
    if isinstance(body, dict) and body.get("status") == "error":
        return terminal_safe(f"{body.get('errorType', 'error')}: {body.get('error', '')}")[:200]
    return ""


def _value(pair: Any) -> tuple[float, float] | None:
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return None
    try:
        t, v = float(pair[0]), float(pair[1])     # Prometheus sends values as strings ("NaN", "+Inf" too)
    except (TypeError, ValueError):
        return None
    return (t, v) if math.isfinite(t) else None


def parse_vector(data: Any, where: str = "Prometheus") -> list[tuple[dict[str, str], float]]:
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise PrometheusError(f"{where}: the query's answer is not an instant vector")
    if len(data["result"]) > MAX_SERIES:
        raise PrometheusError(f"{where}: the query matched {len(data['result'])} series (at most {MAX_SERIES})")
    out = []
    for s in data["result"]:
        tv = _value(s.get("value")) if isinstance(s, dict) else None
        if tv is not None:
            out.append((_labels(s.get("metric")), tv[1]))
    return out


def parse_matrix(data: Any, where: str = "Prometheus") -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PrometheusError(f"{where}: the range query's answer is not a matrix")
    if len(data["result"]) > MAX_SERIES:
        raise PrometheusError(f"{where}: the query matched {len(data['result'])} series (at most {MAX_SERIES})")
    out = []
    for s in data["result"]:
        if not isinstance(s, dict) or not isinstance(s.get("values"), list):
            continue
        pts = [tv for tv in (_value(p) for p in s["values"]) if tv is not None]
        out.append((_labels(s.get("metric")), pts))
    return out


def discover_fleet(url: str, selector: str | None) -> Any:
    """The servers Prometheus scrapes whose target labels match `selector`, follower nodes grouped
    under their leaders (a tuner.fleet.followers.Grouping, with one note per target left out).
    PrometheusError (one line) when there are none."""
    from tuner.fleet.followers import group_followers

    matchers = parse_selector(selector)
    with PrometheusClient(url) as client:
        members, skipped = members_of(client.targets(), matchers)
        if not members:
            why = f" ({skipped[0]})" if skipped else ""
            raise PrometheusError(f"{client.where}: no target matches {selector or '{}'}{why}")
        grouping = group_followers(client, members)
    grouping.notes[:0] = skipped
    return grouping


def discover(url: str, selector: str | None) -> list[Member]:
    """The members of `discover_fleet`."""
    return discover_fleet(url, selector).members
