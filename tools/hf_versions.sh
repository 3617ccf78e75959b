#!/usr/bin/env bash
# Run the Hugging Face tests under a second transformers (default 5.15.0, what Colab ships), reusing .venv's torch.
#
#   tools/hf_versions.sh                 # transformers 5.15.0
#   HF_VERSION=5.15.0 tools/hf_versions.sh -x -q
#
# transformers 5.15.0 and the two packages whose ranges it narrows (huggingface-hub < 2, tokenizers <= 0.23.0,
# from its wheel's Requires-Dist) go into a --target folder outside the repository, put first on PYTHONPATH;
# everything else (torch, numpy, pytest) is .venv's. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
HF_VERSION="${HF_VERSION:-5.15.0}"
TARGET="${HF_TARGET:-${TMPDIR:-/tmp}/swkv-transformers-$HF_VERSION}"

if ! PYTHONPATH="$TARGET" "$VENV/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$HF_VERSION')" 2>/dev/null; then
    echo "hf_versions: installing transformers==$HF_VERSION into $TARGET"
    rm -rf "$TARGET"
    "$VENV/bin/python" -m pip install -q --no-deps --target "$TARGET" \
        "transformers==$HF_VERSION" "huggingface-hub>=1.5,<2" "tokenizers>=0.22,<=0.23.0"
fi
PYTHONPATH="$TARGET" "$VENV/bin/python" -c \
    "import transformers; assert transformers.__version__ == '$HF_VERSION', transformers.__file__; print('hf_versions: testing under transformers', transformers.__version__, 'from', transformers.__file__)"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONPATH="$TARGET" "$VENV/bin/python" -m pytest -p no:cacheprovider \
    tests/test_hf_cache.py tests/test_hf_cache_batch.py tests/test_hf_parity.py tests/test_grading_hf_layer.py \
    tests/test_hf_speculative.py tests/test_bench_hf_batching.py "$@"
