"""One model across nodes: follower nodes grouped under their leader, not reported as non-servers.

On SGLang a multi-node launch (`--nnodes N`) runs the HTTP server on node 0 only; the other nodes run a
health server with `/health`, `/health_generate`, `/ping` and, with `--enable-metrics`, `/metrics`
(SGLang 0.5.23 `engine.py`). Prometheus scrapes both, so discovery sees a target that answers
`/metrics` (Prometheus says it is up) but not `/server_info` (HTTP 404): a follower.

Its leader is found from `specdecode:rank_info{host,tp_rank,dist_init_addr}` in Prometheus:
0. the one server whose rank_info carries the follower's `dist_init_addr` (the plugin labels each
   rank of a multi-node launch with SGLang's --dist-init-addr, the same on every node of one model);
1. a server whose rank_info names the follower's host (a plugin that reports every rank's host); else
2. the one server launched with `nnodes > 1` whose ranks and the follower's are disjoint and fit in
   its `tp_size * pp_size` (a plugin without the address: each node reports its own ranks).
Several such servers, or none, leave the follower ungrouped with one line saying so.

`plan` is pure; `group_followers` asks each member's `/server_info` once (bounded, all at once) and
Prometheus once. Must not change a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping
from urllib.parse import urlsplit

from tuner.fleet.members import Member, ask_each

SERVER, FOLLOWER, UNKNOWN = "server", "follower", "unknown"
FOLLOWER_INSTANCES = "follower_instances"     # a leader's label: its followers' scrape instances
ASK_TIMEOUT_S = 1.0
ASK_DEADLINE_S = 2.0


@dataclass
class Grouping:
    members: list[Member]                                  # the servers to watch, leaders labelled
    followers: dict[str, list[str]] = field(default_factory=dict)   # leader name -> follower names
    notes: list[str] = field(default_factory=list)         # one line per follower left ungrouped


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _ranks(rows: list[Mapping[str, str]]) -> set[int]:
    return {r for r in (_int(x.get("tp_rank")) for x in rows) if r is not None}


def _hosts(rows: list[Mapping[str, str]]) -> set[str]:
    return {x["host"] for x in rows if x.get("host")}


def _launches(rows: list[Mapping[str, str]]) -> set[str]:
    return {x["dist_init_addr"] for x in rows if x.get("dist_init_addr")}


def leader_of(follower: Member, servers: list[Member], infos: Mapping[str, Mapping[str, Any]],
              rank_info: Mapping[str, list[Mapping[str, str]]]) -> tuple[Member | None, str]:
    """The follower's leader among `servers`, or None with the reason (pure)."""
    own = rank_info.get(follower.labels.get("instance", ""), [])
    launch = _launches(own)
    same = [s for s in servers if launch & _launches(rank_info.get(s.labels.get("instance", ""), []))]
    if len(same) == 1:
        return same[0], ""
    hosts = _hosts(own) or {urlsplit(follower.url).hostname or ""}
    ranks = _ranks(own)
    named = [s for s in servers
             if hosts & _hosts(rank_info.get(s.labels.get("instance", ""), []))
             and (urlsplit(s.url).hostname or "") not in hosts]
    if len(named) == 1:
        return named[0], ""
    fits = []
    for s in servers:
        info = infos.get(s.name) or {}
        nnodes = _int(info.get("nnodes")) or 1
        world = (_int(info.get("tp_size")) or 1) * (_int(info.get("pp_size")) or 1)
        theirs = _ranks(rank_info.get(s.labels.get("instance", ""), []))
        if nnodes > 1 and ranks and not (ranks & theirs) and max(ranks) < world:
            fits.append(s)
    candidates = named or fits
    if len(candidates) == 1:
        return candidates[0], ""
    if candidates:
        return None, "its leader is one of " + ", ".join(s.name for s in candidates) + " (cannot tell which)"
    if not ranks:
        return None, "no specdecode:rank_info from it (the plugin names a follower's ranks), so no leader found"
    return None, f"no multi-node server (nnodes > 1) has room for its ranks {sorted(ranks)}"


def plan(members: list[Member], roles: Mapping[str, tuple[str, Mapping[str, Any] | None]],
         rank_info: Mapping[str, list[Mapping[str, str]]]) -> Grouping:
    """Members minus followers, each leader labelled `followers=a,b`; followers never become
    non-servers: grouped, or left out of the watch list with one line."""
    servers = [m for m in members if roles.get(m.name, (UNKNOWN, None))[0] != FOLLOWER]
    infos = {m.name: roles[m.name][1] or {} for m in servers if m.name in roles}
    out = Grouping(servers)
    for m in members:
        if roles.get(m.name, (UNKNOWN, None))[0] != FOLLOWER:
            continue
        leader, why = leader_of(m, [s for s in servers if roles.get(s.name, (UNKNOWN,))[0] == SERVER],
                                infos, rank_info)
        if leader is None:
            out.notes.append(f"{m.name}: a follower node (answers /metrics, not /server_info); {why}")
        else:
            out.followers.setdefault(leader.name, []).append(m.name)
    # The followers' scrape instances too: their nodes' GPUs join to their own instance (their ranks
    # are in their own /metrics), and the leader's row shows every node's.
    instance = {m.name: m.labels.get("instance", "") for m in members}
    out.members = [replace(s, labels={**s.labels, "followers": ",".join(out.followers[s.name]),
                                      FOLLOWER_INSTANCES: ",".join(instance[f] for f in out.followers[s.name])})
                   if s.name in out.followers else s for s in servers]
    return out


def role_of(member: Member) -> tuple[str, Mapping[str, Any] | None]:
    """One bounded GET /server_info: a server (with its info), a follower (404), or unknown."""
    from tuner.backends.http import BadAnswer, HttpClient, ServerError

    try:
        client = HttpClient(member.url, None, timeout=ASK_TIMEOUT_S, deadline=ASK_DEADLINE_S)
    except ServerError:
        return UNKNOWN, None
    try:
        info = client.get_json("/server_info")
        return (SERVER, info) if isinstance(info, dict) else (UNKNOWN, None)
    except BadAnswer as e:
        return (FOLLOWER, None) if e.status == 404 else (UNKNOWN, None)
    except ServerError:
        return UNKNOWN, None
    finally:
        client.close()


def rank_info_by_instance(series: list[tuple[dict[str, str], float]]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for labels, _ in series:
        out.setdefault(labels.get("instance", ""), []).append(labels)
    return out


def group_followers(client: Any, members: list[Member]) -> Grouping:
    """Ask every member's /server_info at once and Prometheus for rank_info, then `plan`."""
    roles: dict[str, tuple[str, Mapping[str, Any] | None]] = ask_each(members, role_of, ASK_DEADLINE_S + 1.0, "role")
    if not any(r[0] == FOLLOWER for r in roles.values()):
        return Grouping(list(members))
    return plan(members, roles, rank_info_by_instance(client.query("specdecode:rank_info")))
