"""Observability: log streaming, metrics from log lines, reports."""
