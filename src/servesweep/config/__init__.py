"""The one description of a load point, the experiment schema and loader, and where secrets come from. Runs in any process."""
