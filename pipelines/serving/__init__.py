"""Serving: a TF Serving-compatible server, its servable and JSON, the client, sync with the
registry."""
