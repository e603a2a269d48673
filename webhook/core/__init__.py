"""The pure decision core: quantities, accounting, headroom, victims and loans, the Plan.

No I/O, no clock reads, no web or Kubernetes client imports (an import-linter contract
keeps it so). Everything here is a function of its arguments.
"""
