"""telemetry: the fireflyer metrics collector."""
