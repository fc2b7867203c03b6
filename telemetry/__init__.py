"""Telemetry: Prometheus exporters (:mod:`.exporter`), the per-run Prometheus server, Grafana
dashboards as code; their pure definitions in :mod:`.model`."""
