"""No import circle among the modules of ``webhook/``, type-checking imports included:
each module can be read knowing only what it imports."""

from __future__ import annotations

import grimp


def test_no_module_of_webhook_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph("webhook", include_external_packages=False)
    circles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    )

    assert [] == circles
