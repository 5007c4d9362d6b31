"""Every key servesweep puts on Locust's wire: request-event context keys, report_to_master payload keys, and the
custom messages between master and workers. One definition each; the locustfile, the user, the web UI and the
exporter hook import them from here."""

RECORD_CONTEXT_KEY = "servesweep_record"  # a request event's context: the finished request's record (a dict)
# report_to_master: a worker's record batch (RecordBuffer.take() columns)
RECORDS_REPORT_KEY = "servesweep_records"
CLIENT_REPORT_KEY = "servesweep_client"  # report_to_master: a process's counters and headroom (clients.json)
LIVE_REPORT_KEY = "servesweep_live"  # report_to_master: {"stats": LiveStats.payload(), "headroom": {...}}
END_MSG = "servesweep_end"  # master -> workers: the duration is over; finish the streams, ship every record
DRAINED_MSG = "servesweep_drained"  # worker -> master: done, every record shipped
ABORT_MSG = "servesweep_abort"  # master -> workers: the load must stop now (the master's parent is gone)
