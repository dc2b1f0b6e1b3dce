# Sourced by the medium-model run benchmarks (layout_bench.sh, overlap_bench.sh), from the
# repository root: builds trident if needed, makes a scratch directory $work (removed on
# exit) with byte-token training data in $work/data (the repository's docs, repeated: any
# English text will do for timing), and sets root_flag for mpirun when run as root.
[[ -x build/trident ]] || cmake --build build --target trident
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for _ in $(seq 40); do cat README.md docs/*.md; done > "$work/text.txt"
build/trident prepare --input "$work/text.txt" --out "$work/data" --tokenizer byte > /dev/null
root_flag=()
if [[ $(id -u) -eq 0 ]]; then root_flag=(--allow-run-as-root); fi
