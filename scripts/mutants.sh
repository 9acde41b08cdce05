#!/usr/bin/env bash
# Mutation check of the protocols: each deliberate bug below is applied (sed) to a
# copy of src/, include/ and tests/ in a temporary directory, never to the working
# tree; the protocol's tests are built there and run, and a table per protocol says
# which tests failed. A mutant that fails no test is a finding (docs/protocol.md
# keeps the last tables). Not run by CI. Three protocols: the mailbox collectives'
# (src/comm; Protocol.*, TwoShotProtocol.*) and the GEMM program's rules
# (src/program/program_protocol.hpp; ProgramProtocol.*, which runs them under host
# threads) and the team program's all-reduce (src/program/program_team.hpp;
# ProgramTeam.*).
#   bash scripts/mutants.sh [mutant-name...]   (default: every mutant; ~15-20 min on 2 cores)
# Why not the whole cpu_tests target: it links the library, whose CUDA objects
# include the mutated headers (minutes per mutant on 2 cores). The protocol tests
# are the protocol_tests sources that drive the protocol (tests/cpu/protocol_test.cpp,
# two_shot_protocol_test.cpp), header-only over src/comm: they are built alone, in
# seconds, with the compiler and GoogleTest protocol_tests uses.
set -uo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-g++}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Shorter deadlines and fewer randomised rounds: a broken protocol fails fast, and
# the deterministic races (a slow owner, one parity) do not depend on the count.
export TPDECODE_PROTOCOL_TIMEOUT_MS=${TPDECODE_PROTOCOL_TIMEOUT_MS:-2000}
export TPDECODE_PROTOCOL_ROUNDS=${TPDECODE_PROTOCOL_ROUNDS:-2000}

# name|file under src/comm|sed script|what the bug is
COMM_MUTANTS=(
  "one-parity|protocol.hpp|s/return box.parities == 2 ? \*epoch \& 1u : \*epoch % static_cast<uint32_t>(box.parities);/return 0u;/|every call uses parity 0 (epoch % 1)"
  "plain-epoch-wrap|protocol.hpp|s/return uint64_t{epoch} + 1 == period ? 0u : epoch + 1;/return epoch + 1;/|epochs wrap at 2^32 whatever the parities (three: parity 0 twice running)"
  "first-word-only|protocol.hpp|s/return f.w\[0\] != kSentinel && f.w\[1\] != kSentinel && f.w\[2\] != kSentinel && f.w\[3\] != kSentinel;/return f.w[0] != kSentinel;/|published() checks the first word only (a torn fragment passes)"
  "no-abort-in-polls|memory.hpp|s/load_word(abort_word) != 0) return PollCheck::kAborted;/false) return PollCheck::kAborted;/|polls never read the abort word (only their own deadline ends them)"
  "entry-ignores-abort|protocol.hpp|s/^  if (abort != 0) {/  if (false) {/|a call enters an aborted team"
  "reversed-sum|protocol.hpp|/^TPD_HD Fragment sum_rank_order/,/^}/{s/raw\[0\]\.w\[j\]/raw[kSlots - 1].w[j]/g;s/raw\[s\]\.w\[j\]/raw[kSlots - 1 - s].w[j]/g}|sums in rank order TP-1 .. 0 (one-shot and two-shot)"
  "unclean-sentinel|protocol.hpp|s/return word == kSentinel ? 0u : word;/return word;/|a data word equal to the sentinel is sent as is"
  "one-shot-skip-rearm|collectives.hpp|/^TPD_HD bool one_shot_collect/,/^}/{/one_shot_rearm<kRanks>(mem, team, box, call, row, frag);/d}|one-shot: the reader never re-arms its slots"
  "one-shot-rearm-before-read|collectives.hpp|/^TPD_HD bool one_shot_collect/,/^}/{/^  one_shot_rearm<kRanks>/d;s/^  if (!one_shot_poll_sum/  one_shot_rearm<kRanks>(mem, team, box, call, row, frag);\n&/}|one-shot: the reader re-arms its slots before polling them"
  "one-shot-wrong-slot|collectives.hpp|/^TPD_HD void one_shot_push/,/^}/s/call.parity, team.rank, row, frag)/call.parity, (team.rank + 1) % kRanks, row, frag)/|one-shot: a rank pushes into its neighbour's slot"
  "gather-skip-rearm|collectives.hpp|/^TPD_HD bool collect_one/,/^}/{/mem.push(slot, armed());/d}|gather (and the two-shot's gather half): the reader never re-arms"
  "gather-rearm-before-read|collectives.hpp|/^TPD_HD bool collect_one/,/^}/{/mem.push(slot, armed());/d;s/^  const Poll result = wait_all/  mem.push(slot, armed());\n&/}|gather (and the two-shot's gather half): re-arm before polling"
  "gather-wrong-slot|collectives.hpp|s/const int column = team.rank \* shard_frags + shard_frag;/const int column = (team.rank + 1) % kRanks * shard_frags + shard_frag;/|gather: a rank pushes its shard into its neighbour's columns"
  "two-shot-skip-rearm|collectives.hpp|/^TPD_HD bool two_shot_reduce/,/^}/{/rearm<kRanks>(mem, slot_of);/d}|two-shot: the owner never re-arms its recv slots"
  "two-shot-rearm-before-read|collectives.hpp|/^TPD_HD bool two_shot_reduce/,/^}/{/^  rearm<kRanks>(mem, slot_of);/d;s/^  if (!poll_ranks/  rearm<kRanks>(mem, slot_of);\n&/}|two-shot: the owner re-arms its recv slots before polling them"
  "two-shot-wrong-owner|collectives.hpp|s/mem.push(slot_fragment(recv, owner, call.parity/mem.push(slot_fragment(recv, (owner + 1) % team.size, call.parity/|two-shot: a chunk is pushed to the next owner"
  "two-shot-wrong-slot|collectives.hpp|s/call.parity, team.rank, row, frag - owner \* owner_frags)/call.parity, (team.rank + 1) % team.size, row, frag - owner * owner_frags)/|two-shot: a rank pushes into its neighbour's recv slot"
  "two-shot-sum-to-one-rank|collectives.hpp|/^TPD_HD bool two_shot_reduce/,/^}/s/push_to_all<kRanks>(/push_to_all<1>(/|two-shot: the owner stores its sum into rank 0's gather row only"
  "two-shot-short-gather-deadline|collectives.hpp|s/^  mem.extend_deadline(team.timeout_ns);/  (void)mem, (void)team;/|two-shot: the gather half waits no longer than the reduce"
)
# name|file under src/program|sed script|what the bug is
PROGRAM_MUTANTS=(
  "finisher-never-sums|program_protocol.hpp|s/{ return u.part == 0 \&\& u.parts > 1; }/{ return false \&\& u.parts > 1; }/|part 0 of a split block is not handed the other parts' sum"
  "every-part-counted|program_protocol.hpp|s/return u.part == 0 \&\& read_by_an_op;/return read_by_an_op;/|every part of a split block publishes and counts it"
  "complete-one-early|program_protocol.hpp|s/return counted_blocks >= /return counted_blocks + 1 >= /|an op counts as complete one block early (copies start)"
  "one-epoch|program_protocol.hpp|s/{ return runs \& 1u; }/{ return 0u * runs; }/|every run publishes into epoch 0"
  "no-last-cta|program_protocol.hpp|s/return before == ctas - 1;/return before == ctas;/|no CTA resets the counters or advances the run"
  "tokens-share-a-row|program_protocol.hpp|s/return offset + token \* stride + row;/return offset + 0 * token * stride + row;/|every token of an op publishes into one mailbox row"
  "parts-share-a-slot|program_protocol.hpp|s/(static_cast<int64_t>(part) \* m + token)/(static_cast<int64_t>(part) * 0 * m + token)/|the parts of a split block share one scratch slot"
  "half-emptied|program_protocol.hpp|s/return {pieces \* cta \/ ctas, pieces \* (cta + 1) \/ ctas};/return {pieces * cta \/ ctas, pieces * cta \/ ctas + (pieces \/ ctas) \/ 2};/|each CTA empties half its share of the next run's epoch"
  "x-unswizzled|program_protocol.hpp|s/((piece ^ (token % 8)) \* 16)/(piece * 16)/|the loaders store x without the 128-byte swizzle wgmma reads"
  "copy-walk-skips-tokens|program_protocol.hpp|s/lane \/ 8 + 4 \* (i % rows)/lane \/ 8 + 8 * (i % rows)/|a checked copy's walk skips tokens 4-7 of every 8"
)
# name|file under src/program|sed script|what the bug is
TEAM_MUTANTS=(
  "team-skip-rearm|program_team.hpp|/lamport::rearm<kRanks>(mem, own);/d|team program: the reader never re-arms its slots"
  "team-rearm-before-read|program_team.hpp|/lamport::rearm<kRanks>(mem, own);/d;s/^  const lamport::Poll result = lamport::wait_all/  lamport::rearm<kRanks>(mem, own);\n&/|team program: the reader re-arms its slots before polling them"
  "team-wrong-slot|program_team.hpp|s/static_cast<int>(parity), team.rank, token, fragment)/static_cast<int>(parity), (team.rank + 1) % kRanks, token, fragment)/|team program: a rank pushes into its neighbour's slot"
  "team-no-advance|program_team.hpp|s/lamport::advance_if_last(mem, team, box, epoch, lamport::take_ticket(mem, team, box), ctas);/(void)epoch, (void)ctas;/|team program: the run's epoch never advances (one parity)"
  "team-silent-failure|program_team.hpp|/lamport::report_poll(mem, team/,+1d|team program: a failed poll is neither recorded nor aborts the team"
)

SELECTED=("$@")
selected() {
  [[ ${#SELECTED[@]} -eq 0 ]] && return 0
  local s; for s in "${SELECTED[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1
}

# build_comm DIR / build_program DIR: a protocol's tests of the tree at DIR into DIR/bin.
build_comm() {
  local dir=$1 tu pids=()
  for tu in protocol_test two_shot_protocol_test; do
    "$CXX" -std=c++20 -O2 -pthread -I"$dir/src" -I"$dir/include" -I"$dir/tests" -c "$dir/tests/cpu/$tu.cpp" \
      -o "$dir/$tu.o" 2> "$dir/$tu.log" & pids+=($!)
  done
  local ok=0; for p in "${pids[@]}"; do wait "$p" || ok=1; done
  [[ $ok -eq 0 ]] && "$CXX" "$dir"/*.o -lgtest -lgtest_main -pthread -o "$dir/bin"
}
# The program's rules run over its real plan (program_plan.cpp, which formats its
# errors with fmt, header-only here).
build_program() {
  local dir=$1
  "$CXX" -std=c++20 -O2 -pthread -DFMT_HEADER_ONLY -I"$dir/src" -I"$dir/include" -I"$dir/tests" \
    "$dir/tests/cpu/program_protocol_test.cpp" "$dir/src/program/program_plan.cpp" -lgtest -lgtest_main -pthread \
    -o "$dir/bin" 2> "$dir/build.log"
}
# The team program's all-reduce (header-only over src/comm and the program's rules).
build_team() {
  local dir=$1
  "$CXX" -std=c++20 -O2 -pthread -I"$dir/src" -I"$dir/include" -I"$dir/tests" "$dir/tests/cpu/program_team_test.cpp" \
    -lgtest -lgtest_main -pthread -o "$dir/bin" 2> "$dir/build.log"
}

# run DIR FILTER: the failed tests, one per line (or a line saying how the run ended).
run() {
  local dir=$1 rc
  timeout 900 "$dir/bin" --gtest_filter="$2" > "$dir/run.log" 2>&1; rc=$?
  grep -oE '^\[  FAILED  \] [A-Za-z]+\.[A-Za-z]+' "$dir/run.log" | sed 's/^\[  FAILED  \] //' | sort -u
  if [[ $rc -ne 0 ]] && ! grep -q 'listed below' "$dir/run.log"; then echo "(ended with rc $rc before finishing)"; fi
}

# cell SUITE: the failed tests of SUITE (from stdin) without the suite's name, or "-".
cell() {
  local names; names=$(grep -E "^$1\.|^\(" | sed "s/^$1\.//" | paste -sd ',' | sed 's/,/, /g')
  echo "${names:--}"
}

mkdir -p "$WORK/base"
cp -r src include tests "$WORK/base/"
start=$SECONDS
uncaught=0

# mutate NAME SUBDIR MUTANTS BUILD "SUITE:heading ..."; the protocol's table on stdout.
mutate() {
  local group=$1 subdir=$2 build=$3 suites=$4; local -n mutants=$5
  local filter="" heading="| mutant | file | the bug |" rule="| --- | --- | --- |" suite m any=0
  for m in "${mutants[@]}"; do selected "${m%%|*}" && any=1; done
  [[ $any -eq 1 ]] || return 0
  for suite in $suites; do filter+="${filter:+:}${suite%%=*}.*"; done
  echo "baseline of the $group tests (no mutation) ..." >&2
  rm -rf "$WORK/baseline" && cp -r "$WORK/base" "$WORK/baseline"
  $build "$WORK/baseline" || { echo "the unmutated $group tests do not build" >&2; exit 1; }
  local failed; failed=$(run "$WORK/baseline" "$filter")
  if [[ -n $failed ]]; then echo "the unmutated $group tests fail: $failed" >&2; exit 1; fi
  for suite in $suites; do heading+=" $(tr _ ' ' <<< "${suite#*=}") (${suite%%=*}.*) |"; rule+=" --- |"; done
  echo; echo "$heading"; echo "$rule"
  local name file script what dir row
  for m in "${mutants[@]}"; do
    IFS='|' read -r name file script what <<< "$m"
    selected "$name" || continue
    echo "$name ... ($((SECONDS - start)) s)" >&2
    dir="$WORK/$name"
    cp -r "$WORK/base" "$dir"
    sed -i -e "$script" "$dir/src/$subdir/$file"
    if cmp -s "$WORK/base/src/$subdir/$file" "$dir/src/$subdir/$file"; then
      echo "| $name | $file | $what | NOT APPLIED (the sed matched nothing: fix the script) |"
      uncaught=$((uncaught + 1)); continue
    fi
    if ! $build "$dir"; then
      echo "| $name | $file | $what | does not compile |"; uncaught=$((uncaught + 1)); continue
    fi
    failed=$(run "$dir" "$filter")
    if [[ -z $failed ]]; then
      echo "| $name | $file | $what | **none: a finding** |"; uncaught=$((uncaught + 1))
    else
      row="| $name | $file | $what |"
      for suite in $suites; do row+=" $(cell "${suite%%=*}" <<< "$failed") |"; done
      echo "$row"
    fi
    rm -rf "$dir"
  done
}

mutate mailbox comm build_comm "Protocol=one-shot_and_gather_tests_that_fail TwoShotProtocol=two-shot_tests_that_fail" COMM_MUTANTS
mutate program program build_program "ProgramProtocol=program_tests_that_fail" PROGRAM_MUTANTS
mutate team program build_team "ProgramTeam=team_program_tests_that_fail" TEAM_MUTANTS
echo "$uncaught mutant(s) not caught; $((SECONDS - start)) s" >&2
exit $((uncaught > 0))
