"""Live and historical observability: the client-metrics exporter, Prometheus configuration, Grafana dashboards generated from code."""
