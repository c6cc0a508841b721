"""The probes read at a window's edges beside the session's core counters, one module each.

Each module defines one `offlab.probes.base.Probe` subclass and holds all of that probe: its reads,
its delta, its stored key and the view a reader takes it back with. `offlab.probes.base.found` finds
them by listing this package when a session starts; a new probe is a new module here, and nothing else.
"""
