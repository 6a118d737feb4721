"""ssr-lab: the research lab beside the server (``pip install ssr-server[lab]``, CLI ``ssr-lab``).

The benchmark world builder (``world``), evaluation and paired comparison (``eval``), training (SFT,
SSR-GRPO, the vision tower, weight soups, probes: ``train``) and the recipes of the shipped model
(``recipes/``). The lab depends on ``ssr_server``; the server never imports the lab.
"""
