"""Trace-driven discrete-event simulation of the scheduler, driving the same tick pipeline as the service."""
