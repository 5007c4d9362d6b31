"""servesweep: benchmark matrices for LLM serving, driven by Locust, Ansible and Prometheus."""

__version__ = "0.1.0"
