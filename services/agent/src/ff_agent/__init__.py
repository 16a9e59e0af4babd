"""The node agent: launches and supervises a run's rank processes, delivers suspend, keeps logs, validates the node."""
