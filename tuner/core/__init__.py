"""The headless core: records, bus, store, session, clock, A/B comparator, load driver.

Must not import textual or torch; the TUI, the recorder, the report and the tuner are views over it.
"""
