"""Batches of agent runs: the runners shared by `ssr-server infer` and `ssr-lab eval`."""
