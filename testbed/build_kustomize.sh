#!/usr/bin/env bash
# Build kustomize (sigs.k8s.io/kustomize/kustomize/v5) from the Go module proxy, once, into
# the same cache as the bed's binaries, keyed by version:
#   ${RETIRE_CACHE:-~/.cache/llm-retire}/kustomize-$KUSTOMIZE_VERSION/bin/kustomize
# It renders deploy/ (tests/offline/test_deploy_manifests.py, tests/bed/test_deploy_on_bed.py).
#
# v5.8.2 is the newest release whose go.mod asks for a Go this machine has (1.26.0; v5.8.3
# asks for 1.27).  Idempotent: a cached binary is not rebuilt.  Prints the binary's path last.
# Environment:
#   RETIRE_CACHE        cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/llm-retire)
#   KUSTOMIZE_VERSION   default v5.8.2 (keep tests/helpers/deploy_render.py in step)
set -euo pipefail

KUSTOMIZE_VERSION=${KUSTOMIZE_VERSION:-v5.8.2}

CACHE=${RETIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-retire}
export GOMODCACHE=${GOMODCACHE:-$CACHE/gomod}
export GOCACHE=${GOCACHE:-$CACHE/gobuild}
export GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$CACHE" "$GOMODCACHE" "$GOCACHE"

BIN=$CACHE/kustomize-$KUSTOMIZE_VERSION/bin

say() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$BIN/kustomize" ]; then
  say "kustomize $KUSTOMIZE_VERSION cached"
else
  start=$SECONDS
  mkdir -p "$BIN"
  # Built into a scratch directory and moved into place whole, so an interrupted build never
  # leaves a binary that looks cached.
  tmp=$(mktemp -d "$CACHE/kustomize-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  say "kustomize $KUSTOMIZE_VERSION: building"
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" >&2
  mv "$tmp/kustomize" "$BIN/kustomize"
  say "kustomize $KUSTOMIZE_VERSION done in $((SECONDS - start)) s"
fi
echo "$BIN/kustomize"
