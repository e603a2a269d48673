"""resize-preemption-webhook: room for in-place pod resizes on full nodes."""

__version__ = "0.1.0"
