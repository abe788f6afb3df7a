"""The immutable records that flow through the bus: Sample, Event and Trace.

Producers (pollers, samplers, the load driver, the replay backend) build these and put them on the
bus; the session moves them into the store and the recorder unchanged. They must stay plain data:
no methods that reach a server, no references to mutable state of their producer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Union

NAN = math.nan


def _freeze(value: Any) -> Any:
    """Deep-freeze JSON-shaped data: dicts become read-only mappings, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of the freezing done by records: plain dicts and lists, ready for json.dumps."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def _same_float(a: float, b: float) -> bool:
    # "Not available" is NaN; two records that both say "not available" are the same record.
    return a == b or (math.isnan(a) and math.isnan(b))


@dataclass(frozen=True, eq=False, slots=True)
class Sample:
    """One reading of one series at one time.

    Attributes:
        t: seconds on the session clock (epoch seconds live; the recording's own times on replay).
        series: scoped name with its unit, e.g. ``server/tok_per_s`` (see tuner.core.series).
        value: the reading; NaN means "not available", never an exception.
    """

    t: float
    series: str
    value: float

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return self.t == other.t and self.series == other.series and _same_float(self.value, other.value)

    def __hash__(self) -> int:
        return hash((self.t, self.series, "nan" if math.isnan(self.value) else self.value))


@dataclass(frozen=True, eq=True, slots=True)
class Event:
    """Something that happened at one time: a config change, a disconnect, a captured trace, a note.

    Attributes:
        t: seconds on the session clock.
        kind: one of tuner.core.events.EventKind (free text is allowed for notes from plugins).
        data: JSON-shaped details, deep-frozen (read-only mappings, tuples for lists).
    """

    t: float
    kind: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", _freeze(self.data))

    def data_json(self) -> str:
        return json.dumps(thaw(self.data), sort_keys=True, allow_nan=True)


@dataclass(frozen=True, eq=True, slots=True)
class Trace:
    """One captured profiler trace file of one rank, with its analysis when there is one.

    Attributes:
        t: seconds on the session clock when the capture finished.
        trace_id: the capture's id (SGLang's profile_id); all ranks of one capture share it.
        rank: the TP rank that wrote the file (-1 when unknown).
        name: the file name the server wrote, e.g. ``1764490000.1-TP-0.trace.json.gz``.
        data: the file's bytes as the server wrote them (gzip for ``.gz`` names).
        analysis: JSON-shaped analysis (the instruments' analyser output), or None.
    """

    t: float
    trace_id: str
    rank: int
    name: str
    data: bytes = field(repr=False)
    analysis: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.analysis is not None:
            object.__setattr__(self, "analysis", _freeze(self.analysis))


Record = Union[Sample, Event, Trace]
