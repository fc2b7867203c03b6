"""Telemetry: Prometheus exporters, the per-run Prometheus server, Grafana dashboards."""
