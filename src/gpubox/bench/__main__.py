"""``python -m gpubox.bench ARGS``: the same as ``gpubox bench ARGS``."""

import sys

from gpubox.bench.cli import main

sys.exit(main(sys.argv[1:]))
