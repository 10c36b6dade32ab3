"""The `gpuwatch` command: serve, query, import, rules, silence, notify and smi."""
