"""Adapters that carry explorl's methods into other training engines (verl; TRL to come).

Each adapter converts the engine's tensors and config to explorl's (`explorl.algos.RolloutBatch`, `AlgoConfig`)
and calls the same algorithm step as explorl's own loop (`explorl.algos.compute_advantages`, the registered
policy losses), so no formula exists twice. An engine with its own dependency pins is installed in its own venv
(`make test-verl`).
"""
