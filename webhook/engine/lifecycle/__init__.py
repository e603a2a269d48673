"""The life of an admitted resize and of its loans, one module per question:

- :mod:`.states`: what state an entry and each of its loans is in (read, never written),
  and the keep rule: what a write to a node keeps;
- :mod:`.changes`: every change the engine makes to a node's entries, each through the
  keep rule;
- :mod:`.next_step`: what the worker does next with an entry, decided from its phase;
- :mod:`.give_back`: which loans are returned now, orphans included.

docs/architecture.md, "The states", draws both state machines.
"""
