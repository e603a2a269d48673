"""One-off experiments: measurements made once to decide a question (what a lender's
memory cgroup does when a loan lowers it, what containerd's overlay diff costs a
checkpoint, what the webhook asks of the API server while nothing happens), kept so
they can be run again. Not part of ``python -m bench``'s default run."""
