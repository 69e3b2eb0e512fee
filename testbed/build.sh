#!/usr/bin/env bash
# Build the real control-plane binaries the test bed runs, once, into a cache outside the
# repository keyed by version:  kube-apiserver + kube-controller-manager (k8s.io/kubernetes),
# etcd (go.etcd.io/etcd/server/v3) and kwok (sigs.k8s.io/kwok); fetches (builds nothing
# from) Kueue's module sigs.k8s.io/kueue for its Workload CRD, which the bed installs; and
# builds promtool (github.com/prometheus/prometheus/cmd/promtool), which checks and
# unit-tests deploy/monitoring/alerts.yaml (tests/offline/test_alerts_promtool.py).
#
# Idempotent: a binary that is already cached is not rebuilt.  Progress goes to stdout.
# Arguments: the steps to run (kwok kueue etcd k8s promtool), default all of them; with
# `promtool` alone the binary's path is printed last.
# Environment:
#   RETIRE_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/llm-retire)
#   PROMETHEUS_VERSION  the Prometheus Go module's version (v0.3XX.Y tags Prometheus 3.XX.Y);
#                  v0.316.0's go.mod asks for Go 1.26.7 (this machine has 1.26.8)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
STAGING_VERSION=${STAGING_VERSION:-v0.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}

CACHE=${RETIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-retire}
export GOMODCACHE=${GOMODCACHE:-$CACHE/gomod}
export GOCACHE=${GOCACHE:-$CACHE/gobuild}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$CACHE" "$GOMODCACHE" "$GOCACHE"

K8S_BIN=$CACHE/k8s-$K8S_VERSION/bin
ETCD_BIN=$CACHE/etcd-$ETCD_VERSION/bin
KWOK_BIN=$CACHE/kwok-$KWOK_VERSION/bin
PROMTOOL_BIN=$CACHE/promtool-$PROMETHEUS_VERSION/bin

say() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# Runs "$@" in the background and prints a heartbeat with the elapsed time and the number
# of packages compiled so far, so a cold build that takes tens of minutes shows progress.
with_progress() {
  local label=$1; shift
  local start=$SECONDS log
  log=$(mktemp)
  ( "$@" ) >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 20
    kill -0 "$pid" 2>/dev/null || break
    say "$label: $((SECONDS - start)) s, $(grep -c . "$log" || true) packages compiled"
  done
  if ! wait "$pid"; then
    say "$label FAILED after $((SECONDS - start)) s; last lines:"
    tail -40 "$log"
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
  say "$label done in $((SECONDS - start)) s"
}

build_kwok() {
  [ -x "$KWOK_BIN/kwok" ] && { say "kwok $KWOK_VERSION cached"; return; }
  mkdir -p "$KWOK_BIN"
  with_progress "kwok $KWOK_VERSION" env GOBIN="$KWOK_BIN" go install -v "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  # The stage files ship in the module; keep a copy beside the binary.
  local moddir
  moddir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$CACHE/kwok-$KWOK_VERSION/stage"
  cp -r "$moddir/kustomize/stage/." "$CACHE/kwok-$KWOK_VERSION/stage/"
  chmod -R u+w "$CACHE/kwok-$KWOK_VERSION/stage"
}

# The Workload CRD is read by the bed from the module cache itself (testbed/paths.py,
# kueue_workload_crd): downloading the module is all there is to do.
fetch_kueue() {
  local crd=config/components/crd/bases/kueue.x-k8s.io_workloads.yaml moddir
  moddir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  [ -f "$moddir/$crd" ] || { say "kueue $KUEUE_VERSION: no $crd in $moddir"; return 1; }
  say "kueue $KUEUE_VERSION Workload CRD: $moddir/$crd"
}

build_etcd() {
  [ -x "$ETCD_BIN/etcd" ] && { say "etcd $ETCD_VERSION cached"; return; }
  local src=$CACHE/src/etcd-$ETCD_VERSION
  mkdir -p "$src" "$ETCD_BIN"
  cat >"$src/main.go" <<'GO'
// Wrapper whose only job is to build the etcd server from its published module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$src" && rm -f go.mod go.sum && go mod init retire.local/etcdbuild >/dev/null 2>&1 \
     && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy)
  with_progress "etcd $ETCD_VERSION" sh -c "cd '$src' && go build -v -trimpath -o '$ETCD_BIN/etcd' ."
}

build_k8s() {
  if [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ]; then
    say "kubernetes $K8S_VERSION cached"; return
  fi
  local src=$CACHE/src/k8s-$K8S_VERSION
  mkdir -p "$src" "$K8S_BIN"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  # Every staging module that k8s.io/kubernetes replaces with ./staging/... is replaced here
  # by its published version; the list comes from that version's own go.mod.
  local replaces
  replaces=$(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[A-Za-z0-9._/-]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\2#p' "$gomod" | sort -u)
  say "kubernetes $K8S_VERSION: $(echo "$replaces" | wc -l) staging modules replaced by $STAGING_VERSION"
  {
    echo "module retire.local/k8sbuild"
    echo
    sed -nE 's#^go ([0-9.]+)$#go \1#p' "$gomod" | head -1
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    for m in $replaces; do echo "replace $m => $m $STAGING_VERSION"; done
  } >"$src/go.mod"
  cat >"$src/tools.go" <<'GO'
//go:build tools

// Package tools pins the commands this wrapper module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
  rm -f "$src/go.sum"
  with_progress "kubernetes $K8S_VERSION module graph" sh -c "cd '$src' && go mod tidy"
  local major minor pkg ld=""
  major=$(echo "${K8S_VERSION#v}" | cut -d. -f1)
  minor=$(echo "${K8S_VERSION#v}" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for cmd in kube-apiserver kube-controller-manager; do
    [ -x "$K8S_BIN/$cmd" ] && continue
    with_progress "$cmd $K8S_VERSION" sh -c "cd '$src' && go build -v -trimpath -ldflags '-s -w $ld' -o '$K8S_BIN/$cmd.tmp' k8s.io/kubernetes/cmd/$cmd && mv '$K8S_BIN/$cmd.tmp' '$K8S_BIN/$cmd'"
  done
}

# promtool from the Prometheus module (its go.mod has no replace directives, so a plain
# `go install module@version` builds it), into a scratch directory moved into place whole:
# an interrupted build never leaves a binary that looks cached.
build_promtool() {
  [ -x "$PROMTOOL_BIN/promtool" ] && { say "promtool $PROMETHEUS_VERSION cached"; return; }
  mkdir -p "$PROMTOOL_BIN"
  local tmp
  tmp=$(mktemp -d "$CACHE/promtool-build.XXXXXX")
  if ! with_progress "promtool $PROMETHEUS_VERSION" env GOBIN="$tmp" go install -v -trimpath \
      -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"; then
    rm -rf "$tmp"
    return 1
  fi
  mv "$tmp/promtool" "$PROMTOOL_BIN/promtool"
  rm -rf "$tmp"
}

start=$SECONDS
say "cache: $CACHE"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(kwok kueue etcd k8s promtool)
for step in "${steps[@]}"; do
  case $step in
    kwok) build_kwok ;;
    kueue) fetch_kueue ;;
    etcd) build_etcd ;;
    k8s) build_k8s ;;
    promtool) build_promtool ;;
    *) echo "build.sh: unknown step $step (kwok kueue etcd k8s promtool)" >&2; exit 2 ;;
  esac
done
say "all binaries ready in $((SECONDS - start)) s"
[ "${steps[*]}" != promtool ] || echo "$PROMTOOL_BIN/promtool"
