"""Training on the benchmark world: pretraining, SFT, the vision tower, SSR-GRPO, weight soups, probes."""
