"""The admission engine and the ports it needs; independent of HTTP and of the client."""
