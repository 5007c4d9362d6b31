#!/usr/bin/env python3
"""Entry point of servesweep's exporter for a finished run folder.

    python exporters/exporter.py serve runs/<run_id> --port 9464        # expose its point summaries
    python exporters/exporter.py push runs/<run_id> --gateway http://127.0.0.1:9091

Live runs expose the same metrics from the process that runs the load (servesweep.observe.exporter.ClientMetrics).
"""

from servesweep.cli.run_exporter import main

if __name__ == "__main__":
    main()
