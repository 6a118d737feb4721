"""The agent: prompt rendering, action grammars, the select-then-generate turn loop and its traces."""
