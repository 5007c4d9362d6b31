#!/usr/bin/env bash
# Download, on the workstation, the cp312 manylinux wheels that the GPU machine lacks (bench/gpu/wheels.txt:
# servesweep's dependencies and `transformers serve`'s extras, minus what the machine's image already has) into
# .whl/, which the device tool carries (carry: [".whl"]). .whl/ must stay out of git.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
plat=()
# pip prefers tags in the order given: these (older glibc first) are the ones the H200 runs were made with, one
# wheel per package (two builds of one package stop the whole install there).
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 \
         manylinux_2_5_x86_64 any; do plat+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d .whl -r bench/gpu/wheels.txt
du -sh .whl
