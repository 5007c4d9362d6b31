"""A whole experiment: the planner and the orchestrator."""
