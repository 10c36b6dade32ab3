"""Prometheus remote write: the wire format (`wire.py`) and what a received request stores (`receive.py`)."""
