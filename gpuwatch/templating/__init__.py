"""Go's text/template, as Prometheus and Alertmanager use it, with their template functions."""
