"""Wiring of the running service: cache, ledger, engine, worker, leader election, web app."""
