"""Telemetry definitions (pure): every metric family from one reading of its source, Prometheus
scrape configurations, and the arithmetic of the ``fabriclab top`` view."""
