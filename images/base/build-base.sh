#!/usr/bin/env bash
# Build a Debian base image from Debian packages, for machines that cannot pull from a container registry:
# debootstrap a minimal root file system, then `docker import` it. Needs root, debootstrap and a Docker engine.
#
#   images/base/build-base.sh [--tag skillrun/base:bookworm] [--suite bookworm] [--mirror URL] [--ca-bundle PATH]
#
# --ca-bundle adds a CA bundle (for networks that intercept TLS) to the image's trusted certificates.
set -euo pipefail

tag=skillrun/base:bookworm
suite=bookworm
mirror=http://deb.debian.org/debian
ca_bundle=""
while (( $# )); do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --ca-bundle) ca_bundle=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "run as root (debootstrap needs it)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "install debootstrap: apt-get install debootstrap" >&2; exit 1; }
[[ -z "$ca_bundle" || -f "$ca_bundle" ]] || { echo "no CA bundle at $ca_bundle" >&2; exit 1; }

# The package list lives in packages.txt beside this script; the image carries it as a label, so images/build.sh
# builds the base again when the list changed.
packages=$(grep -v '^#' "$(dirname "$0")/packages.txt" | paste -sd, -)
rootfs=$(mktemp -d /tmp/skillrun-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "==> debootstrap $suite ($packages) from $mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" \
  | grep --line-buffered -E '^I: (Retrieving|Validating|Extracting|Installing|Configuring|Base)' | sed -u 's/^/    /' || true
[[ -x "$rootfs/usr/bin/python3" ]] || { echo "debootstrap failed" >&2; exit 1; }
if [[ -n "$ca_bundle" ]]; then
  echo "==> adding the CA bundle $ca_bundle"
  cp "$ca_bundle" "$rootfs/usr/local/share/ca-certificates/extra-ca-bundle.crt"
  cat "$ca_bundle" >> "$rootfs/etc/ssl/certs/ca-certificates.crt"
fi
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
echo "==> docker import as $tag"
tar -C "$rootfs" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  -c "LABEL skillrun.base.packages=$packages" \
  - "$tag" >/dev/null
echo "==> built $tag"
