"""Certificates and the server's TLS: making, rotating and serving them."""
