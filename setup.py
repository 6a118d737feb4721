"""Packages only (everything else is in pyproject.toml).

Two packages: ``ssr_server`` (what a server user runs) and ``ssr_lab`` (the research lab, extra
``[lab]``, CLI ``ssr-lab``). ``find_packages`` cannot see a folder outside them, so the top-level
``candidates/`` folder (the shipped rationale libraries, where users look for and edit them) is added
here and mapped into the server package as ``ssr_server.candidates``: installed servers, wheels and
editable installs all have it.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["ssr_server*", "ssr_lab*"]), "ssr_server.candidates"],
    package_dir={"ssr_server.candidates": "candidates"},
)
