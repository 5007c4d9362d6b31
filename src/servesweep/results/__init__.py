"""Per-request records and everything computed from them: summary, compare, gates, report, plots, the run folder. Never imports gevent."""
