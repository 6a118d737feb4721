"""``python -m ssr_server.cli``: the same as ``ssr-server`` (subprocess tests and benches start it so)."""

from ssr_server.cli import main

main()
