"""The admission engine, the preemption worker and the reconciler, their loops, the ledger
model and the ports they need; independent of HTTP and of the client."""
