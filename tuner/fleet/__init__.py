"""A fleet: several servers watched (and changed) from one place.

`members` is the one shape every way of naming a fleet produces (URLs on the command line, a
`--fleet` TOML file, sglang-router's worker list, Prometheus' targets); everything downstream (the
fleet screen, `once`, `record`, `doctor`) takes a list of Members and never asks where it came from.
"""
