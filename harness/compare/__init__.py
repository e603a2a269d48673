"""The comparison's rig: its scenarios, the two sides (this webhook, kube-scheduler's
resize preemption), what is measured and the run of a scenario on a side. The benchmark
that runs them all and reports is ``python -m bench.compare`` (``docs/comparison.md``);
the end-to-end tests run single scenarios with the same rig."""
