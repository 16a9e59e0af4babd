"""hfai: what a user of the fireflyer scheduler touches (SDK and CLI)."""
