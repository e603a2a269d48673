"""Side-by-side comparison with kube-scheduler v1.37.2's resize preemption (KEP-5836).

``python -m bench.compare`` (``make compare``); see ``docs/comparison.md``.
"""
