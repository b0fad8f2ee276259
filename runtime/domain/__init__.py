"""The pure domain of the runtime: typed state, transitions, commit validation, recovery.

Nothing here imports Django or does I/O (DESIGN.md, "Layout"), so every rule is testable
alone, table-driven and with hypothesis.
"""
