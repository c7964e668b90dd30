#!/usr/bin/env bash
# A Debian bookworm base image with Python 3.11, made from Debian's packages alone
# (debootstrap), for hosts that reach a package archive but no container registry.
# `make image` uses it unless IMAGE_BASE names another base (python:3.11-slim, say).
#
#   deploy/container/debian-base.sh [IMAGE]     # default localhost/shardcache-base:bookworm
#
# Needs root, debootstrap and podman. The root filesystem is kept as a tarball under
# $IMAGE_BASE_CACHE (default /var/tmp/shardcache-image) and imported again from
# there when the image is gone; an image already present is left as it is.
set -euo pipefail
image=${1:-localhost/shardcache-base:bookworm}
cache=${IMAGE_BASE_CACHE:-/var/tmp/shardcache-image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
tarball=$cache/bookworm-python3.tar

if podman image exists "$image"; then
    exit 0
fi
if [[ ! -s $tarball ]]; then
    command -v debootstrap >/dev/null || {
        echo "debian-base.sh: debootstrap is not installed (apt-get install -y debootstrap)," \
             "or set IMAGE_BASE to a base image you can pull, e.g. python:3.11-slim" >&2
        exit 2
    }
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/root.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$root" "$mirror"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
fi
podman import --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
echo "debian-base.sh: $image from $tarball"
