#!/usr/bin/env bash
# Build every image: the base (from Debian packages unless --base names an image you have), then the sandbox,
# the worker, the API and an S3-protocol server for compose's two-hosts profile.
#
#   images/build.sh [--base IMAGE] [--ca-bundle PATH] [--tag-prefix skillrun/]
#
# --ca-bundle PATH: a CA bundle for networks that intercept TLS (for example /etc/ssl/certs/ca-certificates.crt);
# it goes into the base image, so pip inside the image builds trusts it too.
set -euo pipefail
cd "$(dirname "$0")/.."

base=""
ca_bundle=""
prefix=skillrun/
while (( $# )); do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --ca-bundle) ca_bundle=$2; shift 2 ;;
    --tag-prefix) prefix=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$base" ]]; then
  base=${prefix}base:bookworm
  wanted=$(grep -v '^#' images/base/packages.txt | paste -sd, -)
  have=$(docker image inspect -f '{{ index .Config.Labels "skillrun.base.packages" }}' "$base" 2>/dev/null || true)
  if [[ "$have" != "$wanted" ]]; then
    bash images/base/build-base.sh --tag "$base" ${ca_bundle:+--ca-bundle "$ca_bundle"}
  else
    echo "==> using the existing $base (docker rmi it to rebuild)"
  fi
fi
for image in sandbox worker api s3; do
  echo "==> building ${prefix}${image}"
  digest=$(sha256sum "images/${image}/Dockerfile" | cut -c1-64)  # the tests rebuild an image whose Dockerfile changed
  docker build --quiet --build-arg BASE="$base" --label "skillrun.dockerfile=$digest" -f "images/${image}/Dockerfile" \
    -t "${prefix}${image}:latest" . >/dev/null
done
echo "==> built: ${prefix}sandbox:latest ${prefix}worker:latest ${prefix}api:latest ${prefix}s3:latest (base $base)"
