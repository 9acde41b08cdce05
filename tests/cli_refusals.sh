#!/usr/bin/env bash
# The tpdecode tool refuses bad input with a clear message and a non-zero exit,
# before it looks for a GPU: `bash tests/cli_refusals.sh path/to/tpdecode`. Each call
# is bounded (a refusal that stopped working on a GPU machine would start a run).
set -u
cli=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# expect_refusal "what the message must say" args...
expect_refusal() {
  local want=$1; shift
  local out rc
  out=$(timeout 60 "$cli" "$@" 2>&1); rc=$?
  if [[ $rc -eq 0 || $rc -eq 124 || "$out" != *"$want"* ]]; then
    echo "FAIL: tpdecode $* -> rc $rc, output: $out (wanted: $want)"
    fails=$((fails + 1))
  fi
}
# The command line itself.
expect_refusal "unknown subcommand 'frobnicate'" frobnicate
expect_refusal "unknown subcommand 'gem'" bench gem
expect_refusal "unknown subcommand 'loads'" bench loads
expect_refusal "unknown subcommand 'load'" lab load
expect_refusal "A subcommand is required" bench
expect_refusal "A subcommand is required" lab
expect_refusal "not expected: extra" drafter extra
expect_refusal "--k: At Most 1 required" drafter --k 3 --k 4
# drafter
expect_refusal "a step takes at most 64 rows" drafter --requests 10 --k 7
expect_refusal "--requests: Value 100000 not in range" drafter --requests 100000
expect_refusal "--requests: Value 0 not in range" drafter --requests 0
expect_refusal "--rows: Value 65 not in range" drafter --rows 65
expect_refusal "--rows: Value 0 not in range" drafter --rows 0
expect_refusal "--layers: Value 0 not in range" drafter --layers 0
expect_refusal "--local-tp 3" drafter --local-tp 3
expect_refusal "--oproj: nonsense not in" drafter --oproj nonsense
expect_refusal "--k is the draft tokens of each of --requests" drafter --k 3
# bench comm
expect_refusal "--rows: Value 0 not in range" bench comm --rows 0
expect_refusal "--op: nonsense not in" bench comm --op nonsense
expect_refusal "--team: foo not in" bench comm --team foo
expect_refusal "--tp: 3 not in" bench comm --tp 3
expect_refusal "--hidden: Value 63 not in range" bench comm --hidden 63
expect_refusal "--hidden: 100 is not a multiple of 64" bench comm --hidden 100
expect_refusal "--vocab-shard: Value 7 not in range" bench comm --vocab-shard 7
expect_refusal "--replays: Value 0 not in range" bench comm --replays 0
expect_refusal "--calls: Value 0 not in range" bench comm --calls 0
expect_refusal "eps -1: a finite number >= 0" bench comm --eps -1
expect_refusal "eps nan: a finite number >= 0" bench comm --eps nan
expect_refusal "eps inf: a finite number >= 0" bench comm --eps inf
expect_refusal "eps 1e39: a finite number >= 0" bench comm --eps 1e39
# bench oproj
expect_refusal "--rows: Value 65 not in range" bench oproj --rows 65
expect_refusal "--rows: Value 0 not in range" bench oproj --rows 0
expect_refusal "--epilogue: nonsense not in" bench oproj --epilogue nonsense
expect_refusal "--tp: 3 not in" bench oproj --tp 3
expect_refusal "--kind: nonsense not in" bench oproj --kind nonsense
expect_refusal "--blocks: Value -1 not in range" bench oproj --blocks -1
# bench gemm
expect_refusal "bench gemm: --m 0 (1 .. 64)" bench gemm --m 0
expect_refusal "bench gemm: --m 65 (1 .. 64)" bench gemm --m 65
expect_refusal "bench gemm: --set bogus" bench gemm --set bogus
expect_refusal "no shapes (--set none without --shape)" bench gemm --set none
expect_refusal "--replays: Value 0 not in range" bench gemm --replays 0
expect_refusal "--invariant-rows: Value 0 not in range" bench gemm --invariant-rows 0
for shape in abc 12x 12x34x56 12x34abc " 12x34" -12x34 0x64 99999999999999999999x1 3000000000x2; do
  expect_refusal "--shape $shape:" bench gemm --set none --shape "$shape"
done
# bench chain
expect_refusal "bench chain: --tp 3" bench chain --tp 3
expect_refusal "bench chain: --m 0 (1 .. 64)" bench chain --m 0
expect_refusal "bench chain: --m 65 (1 .. 64)" bench chain --m 65
expect_refusal "bench chain: --layers 0" bench chain --layers 0
expect_refusal "bench chain: --force nonsense" bench chain --force nonsense
expect_refusal "--timeline with --norms is not served" bench chain --timeline --norms
expect_refusal "--fold-norms needs --norms" bench chain --fold-norms
expect_refusal "--replays: Value 0 not in range" bench chain --replays 0
# tune
TPDECODE_TUNE_CACHE= expect_refusal "name the cache file" tune --tp 8
expect_refusal "tune: no shapes" tune --cache "$tmp/cache.json"
expect_refusal "tune: --m 65" tune --tp 8 --m 65 --cache "$tmp/cache.json"
expect_refusal "tune: --tp 3" tune --tp 3 --cache "$tmp/cache.json"
expect_refusal "the folder of /nonexistent/cache.json does not exist" tune --tp 8 --cache /nonexistent/cache.json
# lab
expect_refusal "lab loads: 100x100 (N a multiple of 64, K of 512)" lab loads --shape 4608x7168 --shape 100x100
expect_refusal "--replays: Value 0 not in range" lab loads --replays 0
expect_refusal "lab launches: --m 65" lab launches --m 65
expect_refusal "--calls: Value 0 not in range" lab launches --calls 0
# --json: a file that can be written, checked before anything runs.
for cmd in "drafter" "bench comm" "bench oproj" "bench gemm" "bench chain" "lab loads"; do
  # shellcheck disable=SC2086 # the command splits into its words
  expect_refusal "the folder of /nonexistent/x.json does not exist" $cmd --json /nonexistent/x.json
  # shellcheck disable=SC2086
  expect_refusal "--json: an empty file name" $cmd --json ""
  # shellcheck disable=SC2086
  expect_refusal "is a folder" $cmd --json "$tmp"
done
expect_refusal "the folder of /nonexistent/x.json does not exist" tune --tp 8 --cache "$tmp/c.json" --json /nonexistent/x.json

# Without a GPU: what needs one is refused, and the CPU step writes its --json.
if "$cli" info --json | grep -q '"gpus": \[\]'; then
  expect_refusal "--replays needs a GPU" drafter --replays 5
  expect_refusal "--local-tp needs a GPU" drafter --local-tp 8
  expect_refusal "--oproj fused needs a GPU" drafter --oproj fused
  if ! timeout 120 "$cli" drafter --rows 1 --oproj auto --json "$tmp/drafter.json" > /dev/null 2>&1 ||
     ! grep -q '"device": "cpu"' "$tmp/drafter.json"; then
    echo "FAIL: drafter --rows 1 --json did not write its checks"
    fails=$((fails + 1))
  fi
fi
version=$("$cli" --version)
[[ "$version" == "tpdecode "* ]] || { echo "FAIL: --version printed '$version'"; fails=$((fails + 1)); }
echo "$fails refusal checks failed"
exit $((fails > 0))
