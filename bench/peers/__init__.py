"""The demo workload on other durable-execution libraries, for ``bench/compare.py``.

Each peer module runs as ``python -m peers.<name>`` from ``bench/`` and prints one JSON
object (see ``peers.workload.report``). Their packages come from the ``bench`` extra.
"""
