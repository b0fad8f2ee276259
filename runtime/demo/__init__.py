"""The demo: an agent whose tools write to an effect ledger (``runtime.demo.agent``), the
ledger's model and the ``demo_ledger`` command. A Django app of its own (label
``runtime_demo``): the repository's project and its tests install it; a host project installs
it only if it asks for it (``INSTALLED_APPS += ["runtime.demo"]``). The engine (``runtime``)
imports nothing from it (an import-linter contract in pyproject.toml)."""
