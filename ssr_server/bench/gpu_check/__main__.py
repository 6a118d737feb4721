"""``python -m ssr_server.bench.gpu_check``."""

from ssr_server.bench.gpu_check.check import main

raise SystemExit(main())
