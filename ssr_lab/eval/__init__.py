"""The benchmark side: oracle trajectories, the eval runner and its report."""
