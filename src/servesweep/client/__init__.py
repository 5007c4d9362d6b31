"""Everything that runs inside a Locust process (gevent): the locustfile, the streaming user, the stream reader, the web UI, load shapes. Nothing outside this folder imports it, Locust or gevent."""
