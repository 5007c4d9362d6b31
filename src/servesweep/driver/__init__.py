"""The parent side of one load point: the Locust command and its processes, local and remote workers, Ansible runs."""
