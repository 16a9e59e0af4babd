# The two commands of the README. Each sets everything up first (scripts/bootstrap.sh).
.PHONY: demo test

# Bring a cluster up on this machine, show it, exercise it, leave it running (`.venv/bin/fireflyer down`).
demo:
	bash scripts/bootstrap.sh
	.venv/bin/fireflyer demo

# The whole test suite: lint, types, protos, import rules, unit, integration, e2e.
test:
	bash scripts/bootstrap.sh
	.venv/bin/tox run
