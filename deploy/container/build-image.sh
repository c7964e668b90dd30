#!/usr/bin/env bash
# make image: the daemon image, built with podman from a wheelhouse on this host.
#
#   deploy/container/build-image.sh            # env: IMAGE, IMAGE_BASE, EXTRAS, PYTHON
#
# 1. The base: IMAGE_BASE if set (python:3.11-slim, or any image the Containerfile
#    accepts), else a Debian bookworm base made from packages (debian-base.sh).
# 2. The wheelhouse, build/wheels/EXTRAS: every wheel the package and its EXTRAS need,
#    for CPython 3.11 on glibc Linux, downloaded by this host's pip (its index and
#    settings); the build installs from it alone (--no-index), so the build needs no
#    network and a rebuild downloads nothing new.
# 3. podman build of deploy/container/Containerfile with the wheelhouse mounted.
set -euo pipefail
cd "$(dirname "$0")/../.."
image=${IMAGE:-localhost/shardcache:0.1.0}
extras=${EXTRAS:-s3}
python=${PYTHON:-python3}
base=${IMAGE_BASE:-}
if [[ -z $base ]]; then
    base=localhost/shardcache-base:bookworm
    deploy/container/debian-base.sh "$base"
fi

wheels=build/wheels/${extras//,/-}
mkdir -p "$wheels"
# the package's dependencies and those of its extras, from pyproject.toml
mapfile -t requirements < <("$python" - "$extras" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = [e for e in sys.argv[1].split(",") if e]
print("setuptools>=68")  # the build backend, which pip installs from the wheelhouse too
print(*project["dependencies"], sep="\n")
for extra in extras:
    print(*project["optional-dependencies"][extra], sep="\n")
PY
)
case $(uname -m) in
    x86_64) arch=x86_64 ;;
    aarch64|arm64) arch=aarch64 ;;
    *) echo "build-image.sh: no wheels for $(uname -m)" >&2; exit 2 ;;
esac
# glibc 2.5 to 2.36 (bookworm's; the slim image's is newer), the legacy names too:
# listed, since older pips do not expand one manylinux tag to the older ones
platforms=(--platform any)
for tag in manylinux1 manylinux2010 manylinux2014 manylinux_2_{5..36}; do
    platforms+=(--platform "${tag}_$arch")
done
"$python" -m pip download --quiet --disable-pip-version-check --dest "$wheels" \
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 \
    --abi none "${platforms[@]}" "${requirements[@]}"

podman build --file deploy/container/Containerfile --tag "$image" \
    --build-arg BASE="$base" --build-arg EXTRAS="$extras" \
    --build-arg PIP_ARGS="--no-index --find-links /wheels" \
    --volume "$PWD/$wheels:/wheels:ro" .
podman image inspect --format '{{.Size}}' "$image" \
    | awk -v i="$image" '{printf "build-image.sh: %s, %.0f MB\n", i, $1 / 1e6}'
