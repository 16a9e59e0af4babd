# The two commands of the README. Each sets everything up first (scripts/bootstrap.sh).
.PHONY: demo test

# Bring a cluster up on this machine, show it, exercise it, leave it running (`.venv/bin/fireflyer down`).
demo:
	bash scripts/bootstrap.sh
	.venv/bin/fireflyer demo

# The whole test suite: lint, types, protos, import rules, unit, the Helm chart, integration, e2e, the container images.
# Two envs at a time: the quick checks first (mypy and the unit tests, each about a minute from a fresh clone, side by
# side); integration and e2e run together, two workers, e2e files first (tox.ini's env "system"); the services image,
# a container cluster of it and the chart under podman kube play after that (env "containers", about 1.5 minutes).
test:
	bash scripts/bootstrap.sh
	.venv/bin/tox run-parallel --parallel 2 --parallel-live --parallel-no-spinner
