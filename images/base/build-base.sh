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
# builds the base again when the list changed. A line name@version is an npm package (npm itself: Debian's npm
# drags in a compiler and hundreds of packages), installed globally from the npm registry after debootstrap.
list="$(dirname "$0")/packages.txt"
packages=$(grep -v '^#' "$list" | paste -sd, -)
debian=$(grep -v -e '^#' -e '@' "$list" | paste -sd, -)
npm_packages=$(grep -v '^#' "$list" | grep '@' || true)
rootfs=$(mktemp -d /tmp/skillrun-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "==> debootstrap $suite ($debian) from $mirror"
debootstrap --variant=minbase --include="$debian" "$suite" "$rootfs" "$mirror" \
  | grep --line-buffered -E '^I: (Retrieving|Validating|Extracting|Installing|Configuring|Base)' | sed -u 's/^/    /' || true
[[ -x "$rootfs/usr/bin/python3" ]] || { echo "debootstrap failed" >&2; exit 1; }
registry=https://registry.npmjs.org
for spec in $npm_packages; do
  name=${spec%@*} version=${spec##*@}
  echo "==> $name $version from $registry"
  document=$(curl -fsS ${ca_bundle:+--cacert "$ca_bundle"} "$registry/$name/$version")
  integrity=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["dist"]["integrity"])' <<<"$document")
  curl -fsS ${ca_bundle:+--cacert "$ca_bundle"} -o "$rootfs/tmp/$name.tgz" "$registry/$name/-/$name-$version.tgz"
  got="sha512-$(openssl dgst -sha512 -binary "$rootfs/tmp/$name.tgz" | base64 -w0)"
  [[ "$got" == "$integrity" ]] || { echo "$name $version: the tarball's digest is not the registry's" >&2; exit 1; }
  mkdir -p "$rootfs/usr/local/lib/node_modules/$name"
  tar -xzf "$rootfs/tmp/$name.tgz" -C "$rootfs/usr/local/lib/node_modules/$name" --strip-components=1 --no-same-owner
  rm "$rootfs/tmp/$name.tgz"
done
if [[ -d "$rootfs/usr/local/lib/node_modules/npm" ]]; then
  ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$rootfs/usr/local/bin/npm"
  ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$rootfs/usr/local/bin/npx"
fi
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
