"""The pure decision core: quantities, what a node's pods hold, victims and lenders, the Plan.

No I/O, no clock reads, no web or Kubernetes client imports (an import-linter contract
keeps it so). Everything here is a function of its arguments.
"""
