"""The Prometheus text and OpenMetrics exposition formats: scanner, parser and writer."""
