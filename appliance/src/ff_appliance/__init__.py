"""The appliance: bring a whole Fire-Flyer cluster up on this machine with one command (``fireflyer``)."""
