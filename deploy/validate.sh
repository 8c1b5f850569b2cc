#!/usr/bin/env bash
# Validates every Kubernetes manifest offline: renders the kustomize base and each overlay with
# `kubectl kustomize` (when kubectl exists) and checks every rendered resource against the
# Kubernetes OpenAPI schemas with kubernetes-validate (--strict: unknown fields are errors).
# Without kubectl, the base's resource files are validated as written and the overlays are skipped,
# with a message. Custom resources (the CloudNativePG `Cluster` of overlays/cloudnativepg) have no
# schema here: kubernetes-validate names them in a warning and checks everything else. Usage: deploy/validate.sh <kubernetes-validate binary>
set -euo pipefail
cd "$(dirname "$0")"
validate=${1:?usage: deploy/validate.sh <kubernetes-validate>}
# The oldest Kubernetes version the manifests target (gRPC probes GA in 1.27, preStop sleep 1.30).
versions="1.30.0 1.33.0"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

files=()
if command -v kubectl >/dev/null 2>&1; then
  for dir in base overlays/dev overlays/prod overlays/cloudnativepg examples/mcp-sidecar; do
    name=${dir//\//-}
    kubectl kustomize "$dir" >"$out/$name.yaml"
    files+=("$out/$name.yaml")
    echo "rendered $dir ($(grep -c '^kind:' "$out/$name.yaml") resources)"
  done
else
  echo "kubectl not found: validating the base resource files as written; overlays not rendered"
  for f in base/*.yaml examples/mcp-sidecar/*.yaml; do
    [[ $(basename "$f") == kustomization.yaml ]] || files+=("$f")
  done
fi
for version in $versions; do
  "$validate" --strict --quiet -k "$version" "${files[@]}"
  echo "kubernetes-validate --strict, Kubernetes $version: ${#files[@]} files valid"
done
