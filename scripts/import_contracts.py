"""Import-linter contract types of this repository (``contract_types`` in ``.importlinter``)."""

from __future__ import annotations

import copy

from grimp import ImportGraph
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.domain.contract import ContractCheck


class ForbiddenThroughPackagesContract(ForbiddenContract):
    """A forbidden contract that also follows the imports Python runs implicitly.

    ``from ff_cluster.lease import lease_expired`` runs ``ff_cluster/__init__.py`` first, and whatever that
    imports (grpc, through ``ff_cluster.membership``). grimp records only the import statements, so the plain
    forbidden contract never sees that chain, indirect imports allowed or not. This one checks a copy of the
    graph in which every module imports its parent package, then applies the usual rules (set
    ``allow_indirect_imports = False`` for the chains to count).
    """

    type_name = "forbidden_through_packages"

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        with_parents = copy.deepcopy(graph)
        for module in graph.modules:
            if "." in module and not graph.is_module_squashed(module):
                parent = module.rsplit(".", 1)[0]
                if parent in graph.modules:
                    with_parents.add_import(importer=module, imported=parent)
        return super().check(with_parents, verbose)
