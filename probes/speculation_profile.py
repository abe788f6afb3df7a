"""speculation_profile.json (schema 1.0, NVIDIA Model-Optimizer's specdec_bench format): building a
profile from a correct-drafts histogram, its two validations, and reading one back for the
engine's acceptance simulator.

Conventions (the format's own): vector entry i is draft position i+1; marginal_accept_rates[i] =
p_{i+1} = P(drafts 1..i+1 all accepted), non-increasing; conditional_accept_rates[i] = α_{i+1} =
p_{i+1} / p_i; both exactly K long. The mean accept length is per verify step and includes the
bonus token, so for longest-prefix verification it equals 1 + Σ marginals; histogram keys are
accept *lengths* (1 = no draft accepted). Chains are `chain_analytic` (safe at a smaller K), trees
`measured_per_k` (a tree re-plans when K changes). Model fields hold ids, never local paths.

Standard library only: the tuner writes profiles, the engine's HTTP process reads them. Must not do
I/O beyond `read`, and must not know about recordings or servers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from probes.json_file import JsonFileError, read_json

SCHEMA_VERSION = "1.0"
TOLERANCE = 0.02
CHAIN_ANALYTIC = "chain_analytic"
MEASURED_PER_K = "measured_per_k"
MAX_FILE_BYTES = 16 << 20

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line."""


def model_id(name: Any) -> str | None:
    """An id for a model field: `org/model` and preset names as they are; a local path becomes its
    last component (a profile travels to other machines and must not name this one's directories)."""
    if not isinstance(name, str) or not name.strip():
        return None
    name = name.strip()
    if _HF_ID.match(name) and not name.startswith("."):
        return name
    return Path(name.rstrip("/\\").replace("\\", "/")).name or None


def rates(h: Sequence[int], k: int) -> tuple[list[float], list[float]]:
    """(conditional, marginal) rate vectors, exactly K long, from a correct-drafts histogram
    (h[j] = verify steps that accepted exactly j drafts). A position after one nobody reached has
    conditional rate 0.0 (the format wants floats, and nothing was accepted there)."""
    from probes.accept_buckets import position_acceptance

    pa = position_acceptance(h, k)
    if pa.verifies <= 0:
        raise ProfileError("no verify steps to build a profile from")
    return [0.0 if math.isnan(a) else a for a in pa.alpha], list(pa.p)


def mean_accept_length(h: Sequence[int]) -> float:
    """Tokens per verify step, bonus included, averaged over steps."""
    total = float(sum(h))
    return 1.0 + sum(j * c for j, c in enumerate(h)) / total if total > 0 else math.nan


def validation(marginal: Sequence[float], mean: float) -> dict[str, Any]:
    """The format's two checks: mean = 1 + Σ marginals within TOLERANCE, and non-increasing marginals."""
    implied = 1.0 + float(sum(marginal))
    delta = abs(implied - mean) if math.isfinite(mean) else math.inf
    violations = [{"position": i + 1, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-12]
    return {
        "mean_consistency": {"implied_mean_accept_length": implied, "reported_mean_accept_length": mean,
                             "abs_delta": delta if math.isfinite(delta) else None, "tolerance": TOLERANCE,
                             "passed": delta <= TOLERANCE},
        "marginal_monotonicity": {"passed": not violations, "violations": violations},
    }


def category(h: Sequence[int], k: int, description: str) -> dict[str, Any]:
    """One `per_category` entry: the rates, mean and histogram of one bucket."""
    conditional, marginal = rates(h, k)
    return {"description": description, "num_verify_steps": int(sum(h)),
            "conditional_accept_rates": conditional, "marginal_accept_rates": marginal,
            "mean_accept_length": mean_accept_length(h), "acceptance_length_histogram": length_histogram(h, k)}


def length_histogram(h: Sequence[int], k: int) -> dict[str, int]:
    """{accept length: verify steps}, dense over 1..K+1 (length = accepted drafts + the bonus)."""
    return {str(j + 1): int(h[j]) if j < len(h) else 0 for j in range(k + 1)}


def build(h: Sequence[int], k: int, *, chain: bool, method: str = "eagle3", target_model: Any = None,
          draft_checkpoint: Any = None, per_category: Mapping[str, dict[str, Any]] | None = None,
          conditions: Mapping[str, Any] | None = None,
          mean_per_request: float | None = None) -> dict[str, Any]:
    """A measured profile at K = `k` from the correct-drafts histogram of one setting.

    Raises:
        ProfileError: an empty histogram, or one with counts beyond K (K was understated)."""
    if k < 1:
        raise ProfileError(f"K must be >= 1, got {k}")
    if any(c for c in h[k + 1:]):
        raise ProfileError(f"accepted counts beyond K = {k}: K was understated")
    conditional, marginal = rates(h, k)
    mean = mean_accept_length(h)
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": method,
        "draft_checkpoint": {"id": model_id(draft_checkpoint)},
        "target_model": {"id": model_id(target_model)},
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": conditional,
        "marginal_accept_rates": marginal,
        "mean_accept_length": mean,
        "mean_accept_length_per_request": mean_per_request,
        "accept_length_model": CHAIN_ANALYTIC if chain else MEASURED_PER_K,
        "accept_length_by_k": {str(k): mean},
        "acceptance_length_histogram": length_histogram(h, k),
        "per_category": dict(per_category or {}),
        "measurement_conditions": dict(conditions or {}),
        "validation": validation(marginal, mean),
    }


# -- reading one back -------------------------------------------------------------------------------

def _rate_vector(p: Mapping[str, Any], key: str, k: int) -> list[float]:
    v = p.get(key)
    if not isinstance(v, list) or len(v) != k:
        raise ProfileError(f"{key} must be a list of exactly num_speculative_tokens = {k} numbers")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
            raise ProfileError(f"{key} must hold probabilities in [0, 1], got {x!r}")
        out.append(float(x))
    return out


def check(p: Any) -> None:
    """Refuse, in one line, a profile the simulator cannot use: not schema 1.0, `measured: false`,
    vectors that are not dense K-long probabilities, or a failure of either validation (recomputed
    from the vectors, whatever the file's own `validation` says)."""
    if not isinstance(p, Mapping):
        raise ProfileError("a profile must be a JSON object")
    if p.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(f"schema_version must be {SCHEMA_VERSION!r}, got {p.get('schema_version')!r}")
    if p.get("measured") is not True:
        raise ProfileError("the profile says measured: false (a placeholder has no acceptance to simulate)")
    k = p.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ProfileError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
    _rate_vector(p, "conditional_accept_rates", k)
    marginal = _rate_vector(p, "marginal_accept_rates", k)
    mean = p.get("mean_accept_length")
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean):
        raise ProfileError(f"mean_accept_length must be a number, got {mean!r}")
    msk = p.get("max_supported_k", k)
    if isinstance(msk, bool) or not isinstance(msk, int) or not 1 <= msk:
        raise ProfileError(f"max_supported_k must be an integer >= 1, got {msk!r}")
    if p.get("accept_length_model") not in (CHAIN_ANALYTIC, MEASURED_PER_K):
        raise ProfileError(f"accept_length_model must be {CHAIN_ANALYTIC!r} or {MEASURED_PER_K!r}, "
                           f"got {p.get('accept_length_model')!r}")
    v = validation(marginal, float(mean))
    if not v["marginal_monotonicity"]["passed"]:
        bad = v["marginal_monotonicity"]["violations"][0]
        raise ProfileError(f"fails marginal_monotonicity: marginal rate at position {bad['position']} "
                           f"({bad['value']:.4f}) exceeds the one before it ({bad['previous']:.4f})")
    if not v["mean_consistency"]["passed"]:
        mc = v["mean_consistency"]
        raise ProfileError(f"fails mean_consistency: 1 + Σ marginals = {mc['implied_mean_accept_length']:.4f} but "
                           f"mean_accept_length = {float(mean):.4f} (tolerance {TOLERANCE})")
    stored = p.get("validation")
    if isinstance(stored, Mapping):
        for name in ("mean_consistency", "marginal_monotonicity"):
            part = stored.get(name)
            if isinstance(part, Mapping) and part.get("passed") is False:
                raise ProfileError(f"the profile's own validation says {name} failed")


def read(path: str | Path) -> dict[str, Any]:
    """One checked profile from a file: a profile object, or a list holding exactly one (what
    `report --speculation-profile --setting LABEL` writes).

    Raises:
        ProfileError: unreadable, not JSON, several profiles, or a profile `check` refuses."""
    path = Path(path)
    try:
        doc = read_json(path, cap=MAX_FILE_BYTES)
    except JsonFileError as e:
        raise ProfileError(str(e)) from None
    if isinstance(doc, list):
        if len(doc) != 1:
            raise ProfileError(f"{path} holds {len(doc)} profiles; pick one (report --speculation-profile "
                               "OUT.json --setting LABEL)")
        doc = doc[0]
    check(doc)
    return dict(doc)


@dataclass(frozen=True)
class ProfileAccept:
    """The acceptance simulator driven by a profile: position k is accepted with the profile's
    conditional rate α_k once positions 1..k−1 were (the engine draws exactly that)."""

    spec: str
    """What the server says it simulates (the profile's method, ids and K), never a path."""
    conditional: tuple[float, ...]
    max_supported_k: int
    tree: bool

    def refuse(self, steps: int, topk: int) -> str | None:
        """Why this profile cannot drive a server at (steps, topk), in one line; None when it can."""
        if steps > 0 and topk == 1 and self.tree:
            return ("the profile was measured on a tree (accept_length_model measured_per_k) and cannot "
                    "simulate a chain (topk 1)")
        if steps > self.max_supported_k:
            return (f"speculative_num_steps {steps} exceeds the profile's max_supported_k "
                    f"{self.max_supported_k}")
        return None

    def alphas(self, steps: int) -> list[float]:
        # Steps beyond K are refused before they run; were one to slip through, the last measured
        # rate continues (never an exception inside an iteration).
        return [self.conditional[min(i, len(self.conditional) - 1)] for i in range(steps)]


def simulator(profile: Mapping[str, Any]) -> ProfileAccept:
    """The simulator for a profile `check` accepted."""
    check(profile)
    k = int(profile["num_speculative_tokens"])
    ids = [((profile.get(f) or {}).get("id") if isinstance(profile.get(f), Mapping) else None)
           for f in ("target_model", "draft_checkpoint")]
    spec = (f"profile {profile.get('method') or '?'} K={k} target={ids[0] or '?'} draft={ids[1] or '?'} "
            f"tau={float(profile['mean_accept_length']):.3f}")
    return ProfileAccept(spec, tuple(float(x) for x in profile["conditional_accept_rates"]),
                         int(profile.get("max_supported_k", k)), profile["accept_length_model"] == MEASURED_PER_K)
