#!/bin/bash
# gpubox sandbox stand-in for 1Panel's install.sh: it must never be run. gpubox reproduces the
# real script's steps itself; a run of this file leaves a mark that the tests look for.
state=${GPUBOX_STANDIN_STATE_DIR:-/var/lib/gpubox-standin}
mkdir -p "$state" 2>/dev/null && date -u +%FT%TZ >>"$state/1panel-install-sh-ran" 2>/dev/null
echo "1Panel install.sh (gpubox sandbox stand-in): never run this script; gpubox installs 1Panel without it" >&2
exit 1
