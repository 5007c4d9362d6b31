"""What a point sends: tokenizers, exact prompt pools, datasets, arrival schedules. Built in the parent, read by the Locust processes."""
