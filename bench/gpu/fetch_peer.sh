#!/usr/bin/env bash
# On the workstation: what bench/gpu/ttft_compare.sh needs beyond .whl/ (bench/gpu/fetch_wheels.sh), into .peer/
# (carried by the device tool, kept out of git): SGLang 0.5.23's bench_serving package files (sglang/benchmark/,
# from the wheel, --no-deps) and the cp312 wheels it imports that the GPU machine lacks (msgspec, orjson, pybase64) and tenacity (servesweep needs it since e7e1e17; bench/gpu/wheels.txt lacks it).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.peer/' .git/info/exclude 2>/dev/null || echo /.peer/ >> .git/info/exclude
rm -rf .peer && mkdir -p .peer/whl .peer/dl
python3 -m pip download -q --no-deps --only-binary=:all: -d .peer/dl sglang==0.5.23
python3 - <<'PY'
import glob, zipfile
z = zipfile.ZipFile(glob.glob(".peer/dl/sglang-0.5.23-*.whl")[0])
names = [n for n in z.namelist() if n.startswith("sglang/benchmark/") and n.endswith(".py")]
z.extractall(".peer", members=names)
print(len(names), "files of sglang/benchmark/")
PY
rm -rf .peer/dl
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  plat+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d .peer/whl msgspec orjson pybase64 tenacity
du -sh .peer; ls .peer/whl
