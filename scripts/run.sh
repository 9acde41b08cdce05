#!/usr/bin/env bash
# Builds tpdecode if needed and runs it: `bash scripts/run.sh` runs the main job
# (`tpdecode drafter`);
# any arguments are passed to the tool instead (e.g. `bash scripts/run.sh info`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_packages
configure_and_build "${BUILD:-build}" tpdecode_cli
if [[ $# -eq 0 ]]; then set -- drafter; fi
exec "${BUILD:-build}/tools/tpdecode" "$@"
