#!/usr/bin/env bash
# The tpdecode tool refuses bad input with a clear message and a non-zero exit,
# before it looks for a GPU: `bash tests/cli_refusals.sh path/to/tpdecode`.
set -u
cli=$1
fails=0
# expect_refusal "what the message must say" args...
expect_refusal() {
  local want=$1; shift
  local out rc
  out=$("$cli" "$@" 2>&1); rc=$?
  if [[ $rc -eq 0 || "$out" != *"$want"* ]]; then
    echo "FAIL: tpdecode $* -> rc $rc, output: $out (wanted: $want)"
    fails=$((fails + 1))
  fi
}
expect_refusal "unknown subcommand 'frobnicate'" frobnicate
expect_refusal "unknown subcommand 'gem'" bench gem
expect_refusal "unknown subcommand 'loads'" bench loads
expect_refusal "unknown subcommand 'load'" lab load
expect_refusal "a step takes at most 64 rows" drafter --requests 10 --k 7
expect_refusal "not in range" drafter --requests 100000
expect_refusal "not in range" drafter --rows 65
expect_refusal "--local-tp 3" drafter --local-tp 3
expect_refusal "not in range" bench comm --rows 0
expect_refusal "op" bench comm --op nonsense
expect_refusal "a finite number >= 0" bench comm --eps -1
expect_refusal "a finite number >= 0" bench comm --eps nan
expect_refusal "a finite number >= 0" bench comm --eps inf
expect_refusal "not in range" bench oproj --rows 65
expect_refusal "epilogue" bench oproj --epilogue nonsense
expect_refusal "oproj" drafter --oproj nonsense
version=$("$cli" --version)
[[ "$version" == "tpdecode "* ]] || { echo "FAIL: --version printed '$version'"; fails=$((fails + 1)); }
echo "$fails refusal checks failed"
exit $((fails > 0))
