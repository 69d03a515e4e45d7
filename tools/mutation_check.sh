#!/usr/bin/env bash
# Shows that tests can fail: copies the package and the tests to a temporary directory, applies one sed
# expression to one file of that copy, and runs pytest there with the given arguments (with its own
# NINFER_CACHE, so the CUDA extension is rebuilt from the changed sources). Exits 0 only if the
# expression changed the file and a selected test failed; the working tree is never touched.
#   bash tools/mutation_check.sh FILE SED_EXPRESSION PYTEST_ARGS...
# e.g. (GPU box) bash tools/mutation_check.sh ninfer_run/kernels/csrc/quant_gemv_sm90.cu \
#        's/rsqrtf(total/rsqrtf(squares/' -m gpu tests/kernels/test_nvfp4_linear.py -k norm_gemv
# (CPU, the Triton interpreter) bash tools/mutation_check.sh ninfer_run/kernels/gdn_gates.py \
#        's/x_ptr + t \* K + k/x_ptr + k/' -m gpu tests/kernels/test_fused_ops.py -k projected
set -uo pipefail
[ $# -ge 3 ] || { sed -n 2,10p "$0"; exit 2; }
file=$1 expression=$2
shift 2
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
cp -r ninfer_run ninfer_pack formats registry tests tools pyproject.toml "$copy"/
sed -i "$expression" "$copy/$file"
if cmp -s "$file" "$copy/$file"; then
    echo "mutation_check: '$expression' changes nothing in $file" >&2
    exit 2
fi
diff "$file" "$copy/$file"
summary=$(cd "$copy" && NINFER_CACHE="$copy/.cache" PYTHONPATH="$copy${PYTHONPATH:+:$PYTHONPATH}" \
    python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -5)
echo "$summary"
# a failed test, not an error in collection or a fixture (pytest exits 1 for both)
if grep -qE "[0-9]+ failed" <<<"$summary" && ! grep -qE "[0-9]+ errors?" <<<"$summary"; then
    echo "mutation_check: caught (a test failed)"; exit 0
fi
echo "mutation_check: NOT caught (no test failed, or errors)" >&2
exit 1
