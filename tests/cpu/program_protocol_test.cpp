// The GEMM program's protocol (program_protocol.hpp, the rules the kernel follows)
// run by host threads over a real plan (plan_program) and mailbox layout: each CTA
// a consumer thread (which also loads x, as the loader warps do: polling the
// mailbox's words until the producing op's count is complete, copying after and
// polling a copied word found empty where counts are relaxed) and a finisher
// thread (which sums split blocks' other parts and counts published blocks, as the
// finisher's warps: relaxed up to protocol::kRelaxedCountRows rows, released above; with
// relaxed counts a consumer stores a block's words after handing it over to be
// counted, as a relaxed count lets a reader see it before them); the mailbox,
// scratch slots and counters are atomics; random delays at every step; exact
// integer products and fresh inputs every run, run after run with nothing reset in
// between. Norm ops as the finisher runs them (program_norm.cuh): each CTA's share
// of the columns, its row statistics published into the mailbox and every CTA's
// polled, with an exact integer stand-in for the norm (out = h * (S mod 7 + 1), S the row's sum of
// squares); a folded norm as its producer and readers run it (program_fold.cuh): the
// producer's blocks' row sums of squares published with them, the readers reading the
// producer's out and scaling their sums by the stand-in's factor, which the finisher
// computes from the polled sums before the CTA's first unit of the reader. It checks
// every output (a folded norm's: through its reader),
// that no copy reads a value not yet published, that the counts complete and reset,
// that the epochs alternate and leave the next run's epoch empty, and that no wait
// hangs; and that planted bugs (a missing wait: copies unchecked, a wait on a
// later op, a count not advanced, a stale epoch, a norm that reads the statistics
// unpolled, a fold's prologue that reads the row sums unpolled) each fail.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "program/program_plan.hpp"
#include "program/program_protocol.hpp"

namespace tpdecode::program {
namespace {

enum class Bug {
  kNone,
  kMissingWait,
  kWaitOnLaterOp,
  kCountNotAdvanced,
  kStaleEpoch,
  kNormStatsUnpolled,
  kFoldSumsUnpolled
};

constexpr int64_t kEmpty = std::numeric_limits<int64_t>::min();  // a word or slot not written
constexpr int kReleasedRows = protocol::kRelaxedCountRows + 1;  // the fewest rows counted with release

using Clock = std::chrono::steady_clock;

struct Chain {
  std::vector<OpShape> shapes;
  std::vector<int> after;      // -1: x is an input; else x is a window of that op's out
  std::vector<int64_t> column;  // the window's first column
};

// Op 1 reads op 0's columns from 8, op 3 all of op 2's (an input of the program in
// the middle), op 4 op 3's from 64; op 5 a folded norm of op 4's columns 0 .. 127,
// which op 6 reads; op 7 a norm of op 4's out, which op 8 reads; op 9 a norm of op
// 0's columns 64 .. 191, read by nothing.
Chain test_chain() {
  return {{{448, 256},
           {256, 256},
           {320, 256},
           {256, 320},
           {192, 128},
           {128, 128, true, true},
           {64, 128},
           {192, 192, true},
           {128, 192},
           {128, 128, true}},
          {-1, 0, -1, 2, 3, 4, 5, 4, 7, 0},
          {0, 8, 0, 0, 64, 0, 0, 0, 0, 64}};
}

// The program's wiring of the folded norms (gemm_program.cpp's fold_norms): a
// folded norm's readers read its producer's out (their windows shifted by the
// norm's), and the producer keeps row sums.
struct Folds {
  std::vector<int> after;       // per op, what its x is a window of in the program
  std::vector<int> scale_from;  // per op, the folded norm it reads (-1: none)
  std::vector<OpShape> shapes;  // with the producers' row_stats
};
Folds folds_of(const Chain& chain, std::vector<int64_t>& window) {
  Folds f{chain.after, std::vector<int>(chain.after.size(), -1), chain.shapes};
  for (std::size_t n = 0; n < chain.shapes.size(); ++n) {
    if (!chain.shapes[n].folded) continue;
    f.shapes[static_cast<std::size_t>(chain.after[n])].row_stats = true;
    for (std::size_t j = 0; j < chain.shapes.size(); ++j)
      if (chain.after[j] == static_cast<int>(n)) {
        f.after[j] = chain.after[n];
        f.scale_from[j] = static_cast<int>(n);
        window[j] += window[n];
      }
  }
  return f;
}

// The windows as the program's checks find them (check_buffers) in buffers laid out
// as a caller would: every out contiguous, each x a window of its producer's out.
std::vector<int64_t> windows_of(const Chain& chain, int m) {
  std::vector<OpBuffers> buffers;
  for (std::size_t i = 0; i < chain.shapes.size(); ++i) {
    const OpShape& s = chain.shapes[i];
    const Matrix out{0x1000000u * (i + 1), m, s.n, s.n};
    Matrix x{0x40000000u + 0x1000000u * i, m, s.k, s.k};
    if (chain.after[i] >= 0) {
      const Matrix& from = buffers[static_cast<std::size_t>(chain.after[i])].out;
      x = {from.data + static_cast<uintptr_t>(chain.column[i]) * 2, m, s.k, from.row_stride};
    }
    buffers.push_back({x, out, chain.after[i]});
  }
  return check_buffers(buffers);
}

class Model {
 public:
  Model(Chain chain, int m, int ctas, Bug bug, unsigned seed)
      : chain_(std::move(chain)),
        m_(m),
        relaxed_(protocol::relaxed_counts(m)),
        ctas_(ctas),
        bug_(bug),
        seed_(seed),
        window_(windows_of(chain_, m)),
        folds_(folds_of(chain_, window_)),
        plan_(plan_program(folds_.shapes, ctas, m, 1)),
        layout_(mailbox_layout(folds_.shapes, folds_.after, m, ctas)),
        mailbox_(static_cast<std::size_t>(2 * layout_.epoch_elements)),
        scratch_(static_cast<std::size_t>(plan_.scratch_floats)),
        op_done_(chain_.shapes.size()) {
    for (auto& w : mailbox_) w.store(kEmpty);
    for (auto& s : scratch_) s.store(kEmpty);
    for (auto& d : op_done_) d.store(0);
    out_.resize(chain_.shapes.size());
    for (std::size_t o = 0; o < chain_.shapes.size(); ++o)
      out_[o].assign(static_cast<std::size_t>(m * chain_.shapes[o].n), kEmpty);
  }

  // One run (a kernel launch: every thread joined at its end).
  void run(int r) {
    run_ = r;
    for (auto& o : out_) std::fill(o.begin(), o.end(), kEmpty);
    std::vector<Cta> ctas(static_cast<std::size_t>(ctas_));
    std::vector<std::thread> threads;
    for (int c = 0; c < ctas_; ++c) {
      Cta& cta = ctas[static_cast<std::size_t>(c)];
      cta.pre.assign(static_cast<std::size_t>(m_ * kBlockRows), 0);
      cta.scale.assign(static_cast<std::size_t>(m_), 0);
      threads.emplace_back([this, c, &cta] { consumer(c, cta); });
      threads.emplace_back([this, c, &cta] { finisher(c, cta); });
    }
    for (std::thread& t : threads) t.join();
  }

  // What the run should have written: exact products of the run's inputs (a norm:
  // its stand-in of them).
  std::vector<int64_t> reference(int op) const {
    const OpShape& s = chain_.shapes[static_cast<std::size_t>(op)];
    const int from = chain_.after[static_cast<std::size_t>(op)];
    const std::vector<int64_t> prev = from >= 0 ? reference(from) : std::vector<int64_t>{};
    std::vector<int64_t> y(static_cast<std::size_t>(m_ * s.n));
    auto x_at = [&](int t, int64_t k) {
      return from >= 0 ? prev[static_cast<std::size_t>(t * chain_.shapes[static_cast<std::size_t>(from)].n +
                                                       chain_.column[static_cast<std::size_t>(op)] + k)]
                       : input(t, k);
    };
    if (s.norm) {
      for (int t = 0; t < m_; ++t) {
        int64_t squares = 0;
        for (int64_t k = 0; k < s.k; ++k) squares += x_at(t, k) * x_at(t, k);
        for (int64_t k = 0; k < s.k; ++k) y[static_cast<std::size_t>(t * s.n + k)] = norm_out(x_at(t, k), squares);
      }
      return y;
    }
    for (int t = 0; t < m_; ++t)
      for (int64_t row = 0; row < s.n; ++row) {
        int64_t v = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          const int64_t x = from >= 0 ? prev[static_cast<std::size_t>(t * chain_.shapes[from].n +
                                                                      chain_.column[static_cast<std::size_t>(op)] + k)]
                                      : input(t, k);
          v += x * weight(op, row, k);
        }
        y[static_cast<std::size_t>(t * s.n + row)] = v;
      }
    return y;
  }

  const std::vector<int64_t>& out(int op) const { return out_[static_cast<std::size_t>(op)]; }
  bool folded(int op) const { return chain_.shapes[static_cast<std::size_t>(op)].folded; }
  int ops() const { return static_cast<int>(chain_.shapes.size()); }
  bool timed_out() const { return timed_out_.load(); }
  int unpublished_reads() const { return unpublished_reads_.load(); }
  bool counts_completed() const { return counts_completed_; }
  uint32_t runs() const { return runs_.load(); }
  bool counters_reset() const {
    for (const auto& d : op_done_)
      if (d.load() != 0) return false;
    return ctas_done_.load() == 0;
  }
  bool scratch_empty() const {
    for (const auto& s : scratch_)
      if (s.load() != kEmpty) return false;
    return true;
  }
  // The epoch the next run publishes into holds nothing.
  bool next_epoch_empty() const {
    const int64_t base = protocol::publish_epoch(runs_.load()) * layout_.epoch_elements;
    for (int64_t i = 0; i < layout_.epoch_elements; ++i)
      if (mailbox_[static_cast<std::size_t>(base + i)].load() != kEmpty) return false;
    return true;
  }
  const Plan& plan() const { return plan_; }

 private:
  // A CTA's shared memory between its consumer and finisher: the sum of parts
  // 1.. for part 0, and the hand-over counts (the kernel's mbarrier phases).
  struct Cta {
    std::vector<int64_t> pre;
    std::vector<int64_t> scale;  // per token, a folded norm's reader's factor (the prologue)
    std::atomic<int> pre_full{0}, pre_empty{0}, pub_full{0}, pub_empty{0}, consumer_done{0};
    std::atomic<int> prologue_full{0}, prologue_empty{0};
  };

  int64_t input(int t, int64_t k) const { return (run_ * 7 + t * 3 + k) % 5 - 2; }
  // The norm's exact stand-in: h scaled by a function of its row's sum of squares.
  static int64_t norm_factor(int64_t squares) { return squares % 7 + 1; }
  static int64_t norm_out(int64_t h, int64_t squares) { return h * norm_factor(squares); }
  static int64_t weight(int op, int64_t row, int64_t k) { return (op * 11 + row * 5 + k * 3) % 7 - 3; }

  // Random yields and short sleeps, so that threads interleave differently each time.
  void jitter(std::mt19937& rng) const {
    const unsigned r = rng() % 64;
    if (r < 8) std::this_thread::yield();
    else if (r == 8) std::this_thread::sleep_for(std::chrono::microseconds(20 + rng() % 200));
  }

  // Waits until done() (bounded: past the deadline every wait of the run gives up).
  template <class F>
  bool wait_until(F&& done, std::mt19937& rng) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(bug_ == Bug::kNone ? 20000 : 400);
    while (!done()) {
      if (timed_out_.load() || Clock::now() > deadline) {
        timed_out_.store(true);
        return false;
      }
      jitter(rng);
    }
    return true;
  }

  std::atomic<int64_t>& word(uint32_t epoch, int64_t element) {
    return mailbox_[static_cast<std::size_t>(epoch * layout_.epoch_elements + element)];
  }
  bool read_by_an_op(int op) const { return layout_.offset[static_cast<std::size_t>(op)] >= 0; }
  // The order of a count and of a reader's load of it: relaxed, or release / acquire.
  std::memory_order count_order() const { return relaxed_ ? std::memory_order_relaxed : std::memory_order_release; }
  std::memory_order read_order() const { return relaxed_ ? std::memory_order_relaxed : std::memory_order_acquire; }

  // Token t's x at column col for op `op`: an input, or the producing op's word by
  // the loaders' rule (polled until written while its count is short, copied after,
  // a copied word that is empty polled).
  bool load_x(int op, int t, int64_t col, uint32_t epoch, bool& copies, int64_t& x, std::mt19937& rng) {
    int from = folds_.after[static_cast<std::size_t>(op)];
    if (from < 0) return x = input(t, col), true;
    if (bug_ == Bug::kWaitOnLaterOp && op == 1) from = 2;  // op 1 waits on the op after it
    const auto f = static_cast<std::size_t>(from);
    const int64_t stride = layout_.stride[f];
    const int64_t first = layout_.offset[f] + window_[static_cast<std::size_t>(op)];  // the kernel's x_mailbox
    std::atomic<int64_t>& w = word(epoch, protocol::mailbox_element(first, stride, t, col));
    if (bug_ == Bug::kMissingWait) copies = true;
    if (!copies) copies = protocol::complete(op_done_[f].load(read_order()), plan_.blocks[f]);
    auto polled = [&] { return wait_until([&] { return (x = w.load(std::memory_order_relaxed)) != kEmpty; }, rng); };
    if (!copies) return polled();
    x = w.load(std::memory_order_relaxed);  // a copy, its words checked where counts are relaxed
    if (x != kEmpty) return true;
    if (relaxed_ && bug_ != Bug::kMissingWait) return polled();
    unpublished_reads_.fetch_add(1), x = 0;  // counted; 0 keeps the sums off the sentinel
    return true;
  }

  void consumer(int c, Cta& cta) {
    std::mt19937 rng(seed_ * 7919u + static_cast<unsigned>(run_ * 131 + c * 2));
    const uint32_t epoch = protocol::publish_epoch(runs_.load());
    const protocol::Range share = protocol::empty_share(layout_.epoch_elements / 8, c, ctas_);
    for (int64_t piece = share.begin; piece < share.end; ++piece)
      for (int e = 0; e < 8; ++e) word(epoch ^ 1u, piece * 8 + e).store(kEmpty, std::memory_order_relaxed);
    int pre_taken = 0, published = 0, prologues = 0;
    for (int i = plan_.cta_begin[c]; i < plan_.cta_begin[c + 1]; ++i) {
      const Unit& u = plan_.units[static_cast<std::size_t>(i)];
      const OpShape& s = chain_.shapes[static_cast<std::size_t>(u.op)];
      const bool scaled = folds_.scale_from[static_cast<std::size_t>(u.op)] >= 0;
      const bool last_of_op = i + 1 == plan_.cta_begin[c + 1] || plan_.units[static_cast<std::size_t>(i + 1)].op != u.op;
      auto release_prologue = [&] {
        if (scaled && last_of_op) cta.prologue_empty.store(++prologues, std::memory_order_release);
      };
      std::vector<int64_t> acc(static_cast<std::size_t>(m_ * kBlockRows), 0);
      bool copies = false;
      for (int step = u.step_begin; step < u.step_end; ++step) {
        jitter(rng);
        for (int t = 0; t < m_; ++t)
          for (int64_t col = step * 64; col < (step + 1) * 64 && col < s.k; ++col) {
            int64_t x = 0;
            if (!load_x(u.op, t, col, epoch, copies, x, rng)) return finish(cta);
            for (int r = 0; r < kBlockRows; ++r) {
              const int64_t row = int64_t{u.block} * kBlockRows + r;
              if (row < s.n) acc[static_cast<std::size_t>(t * kBlockRows + r)] += x * weight(u.op, row, col);
            }
          }
      }
      jitter(rng);
      const bool first_of_op = i == plan_.cta_begin[c] || plan_.units[static_cast<std::size_t>(i - 1)].op != u.op;
      if (scaled && first_of_op &&
          !wait_until([&] { return cta.prologue_full.load(std::memory_order_acquire) > prologues; }, rng))
        return finish(cta);
      if (u.part > 0) {
        for (int t = 0; t < m_; ++t)
          for (int r = 0; r < kBlockRows; ++r)
            scratch_[static_cast<std::size_t>(protocol::part_element(u.scratch, u.part, m_, t, r))].store(
                acc[static_cast<std::size_t>(t * kBlockRows + r)], std::memory_order_relaxed);
        release_prologue();
        continue;
      }
      if (protocol::finisher_sums(u)) {
        if (!wait_until([&] { return cta.pre_full.load(std::memory_order_acquire) > pre_taken; }, rng))
          return finish(cta);
        for (std::size_t e = 0; e < acc.size(); ++e) acc[e] = cta.pre[e] + acc[e];
        cta.pre_empty.store(++pre_taken, std::memory_order_release);
      }
      if (scaled)
        for (std::size_t e = 0; e < acc.size(); ++e) acc[e] *= cta.scale[e / kBlockRows];
      const bool read = read_by_an_op(u.op);
      // A counted block handed over to be counted: with relaxed counts before its
      // words are stored (a reader may see the count first), op 0's late, so that its
      // readers see its count before them; with released counts after them, op 0's
      // late, so that its readers start before them.
      auto hand_over = [&] {
        if (!wait_until([&] { return cta.pub_empty.load(std::memory_order_acquire) >= published; }, rng)) return false;
        cta.pub_full.store(++published, std::memory_order_release);
        return true;
      };
      if (protocol::counted(u, read)) {
        if (relaxed_ && !hand_over()) return finish(cta);
        if (u.op == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        jitter(rng);
      }
      for (int t = 0; t < m_; ++t)
        for (int r = 0; r < kBlockRows; ++r) {
          const int64_t row = int64_t{u.block} * kBlockRows + r;
          if (row >= s.n) continue;
          const int64_t v = acc[static_cast<std::size_t>(t * kBlockRows + r)];
          out_[static_cast<std::size_t>(u.op)][static_cast<std::size_t>(t * s.n + row)] = v;
          if (protocol::counted(u, read)) {
            const auto o = static_cast<std::size_t>(u.op);
            word(epoch, protocol::mailbox_element(layout_.offset[o], layout_.stride[o], t, row))
                .store(v, std::memory_order_relaxed);
          }
        }
      if (protocol::counted(u, read) && !relaxed_ && !hand_over()) return finish(cta);
      const auto o = static_cast<std::size_t>(u.op);
      // The block's row sums of squares, each word its own arrival: after the count
      // (block 0's late), and the words past the blocks zeros.
      if (folds_.shapes[o].row_stats) {
        const int64_t stride = row_stats_stride(s.n);
        if (u.block == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        for (int t = 0; t < m_; ++t) {
          int64_t squares = 0;
          for (int r = 0; r < kBlockRows; ++r)
            if (int64_t{u.block} * kBlockRows + r < s.n)
              squares += acc[static_cast<std::size_t>(t * kBlockRows + r)] * acc[static_cast<std::size_t>(t * kBlockRows + r)];
          word(epoch, 2 * protocol::stats_word(layout_.stats[o], stride, t, u.block)).store(squares, std::memory_order_relaxed);
          if (u.block == plan_.blocks[o] - 1)
            for (int64_t pad = plan_.blocks[o]; pad < stride; ++pad)
              word(epoch, 2 * protocol::stats_word(layout_.stats[o], stride, t, static_cast<int>(pad)))
                  .store(0, std::memory_order_relaxed);
        }
      }
      release_prologue();
    }
    finish(cta);
  }

  // The prologue of a folded norm's reader `op` (program_fold.cuh's FoldedRstd): per
  // token the producer's row sums of the norm's blocks, polled, into the factor.
  bool prologue(int op, uint32_t epoch, Cta& cta, int given, std::mt19937& rng) {
    if (!wait_until([&] { return cta.prologue_empty.load(std::memory_order_acquire) >= given; }, rng)) return false;
    const auto norm = static_cast<std::size_t>(folds_.scale_from[static_cast<std::size_t>(op)]);
    const auto producer = static_cast<std::size_t>(chain_.after[norm]);
    const int64_t stride = row_stats_stride(chain_.shapes[producer].n);
    const int64_t first = window_[norm] / kBlockRows, blocks = (chain_.shapes[norm].k + kBlockRows - 1) / kBlockRows;
    for (int t = 0; t < m_; ++t) {
      int64_t squares = 0;
      for (int64_t b = first; b < first + blocks; ++b) {
        std::atomic<int64_t>& w = word(epoch, 2 * protocol::stats_word(layout_.stats[producer], stride, t, static_cast<int>(b)));
        int64_t v = 0;
        if (bug_ == Bug::kFoldSumsUnpolled) {
          v = w.load(std::memory_order_relaxed);
          if (v == kEmpty) unpublished_reads_.fetch_add(1), v = 0;
        } else if (!poll(w, v, rng)) {
          return false;
        }
        squares += v;
      }
      cta.scale[static_cast<std::size_t>(t)] = norm_factor(squares);
    }
    jitter(rng);
    cta.prologue_full.store(given + 1, std::memory_order_release);
    return true;
  }
  static void finish(Cta& cta) { cta.consumer_done.store(1, std::memory_order_release); }

  // A value of the mailbox, polled until published (false: the run timed out).
  bool poll(std::atomic<int64_t>& w, int64_t& v, std::mt19937& rng) {
    return wait_until([&] { return (v = w.load(std::memory_order_relaxed)) != kEmpty; }, rng);
  }

  // CTA c's share of norm op o (program_norm.cuh's steps), once pre's last sum is taken.
  bool norm_share(int c, int o, uint32_t epoch, Cta& cta, int pre_given, std::mt19937& rng) {
    const auto op = static_cast<std::size_t>(o);
    const OpShape& s = chain_.shapes[op];
    const int from = chain_.after[op];
    if (!wait_until([&] { return cta.pre_empty.load(std::memory_order_acquire) >= pre_given; }, rng)) return false;
    const protocol::Range share = protocol::norm_share(s.k, c, ctas_);
    // 1. h: x of the share, polled where an op publishes it.
    std::vector<int64_t> h(static_cast<std::size_t>(m_ * s.k), 0);
    for (int t = 0; t < m_; ++t)
      for (int64_t col = 8 * share.begin; col < 8 * share.end; ++col) {
        int64_t& v = h[static_cast<std::size_t>(t * s.k + col)];
        if (from < 0) {
          v = input(t, col);
          continue;
        }
        const auto f = static_cast<std::size_t>(from);
        const int64_t first = layout_.offset[f] + window_[op];
        if (!poll(word(epoch, protocol::mailbox_element(first, layout_.stride[f], t, col)), v, rng)) return false;
      }
    // 2. The share's sums of squares (the last CTA's late), CTA 0 the zeros past the CTAs.
    jitter(rng);
    if (c == ctas_ - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    const int64_t stride = layout_.stats_stride;
    auto stat = [&](int t, int cta) -> std::atomic<int64_t>& {
      return word(epoch, 2 * protocol::stats_word(layout_.stats[op], stride, t, cta));
    };
    for (int t = 0; t < m_; ++t) {
      int64_t partial = 0;
      for (int64_t col = 8 * share.begin; col < 8 * share.end; ++col)
        partial += h[static_cast<std::size_t>(t * s.k + col)] * h[static_cast<std::size_t>(t * s.k + col)];
      stat(t, c).store(partial, std::memory_order_relaxed);
      if (c == 0)
        for (int64_t pad = ctas_; pad < stride; ++pad) stat(t, static_cast<int>(pad)).store(0, std::memory_order_relaxed);
    }
    // 3. Every CTA's sums; 4. the share's outputs, published and counted.
    for (int t = 0; t < m_; ++t) {
      int64_t squares = 0;
      for (int64_t other = 0; other < stride; ++other) {
        int64_t v = 0;
        if (bug_ == Bug::kNormStatsUnpolled) {
          v = stat(t, static_cast<int>(other)).load(std::memory_order_relaxed);
          if (v == kEmpty) unpublished_reads_.fetch_add(1), v = 0;
        } else if (!poll(stat(t, static_cast<int>(other)), v, rng)) {
          return false;
        }
        squares += v;
      }
      for (int64_t col = 8 * share.begin; col < 8 * share.end; ++col) {
        const int64_t v = norm_out(h[static_cast<std::size_t>(t * s.k + col)], squares);
        out_[op][static_cast<std::size_t>(t * s.n + col)] = v;
        if (read_by_an_op(o))
          word(epoch, protocol::mailbox_element(layout_.offset[op], layout_.stride[op], t, col))
              .store(v, std::memory_order_relaxed);
      }
    }
    jitter(rng);
    if (read_by_an_op(o)) op_done_[op].fetch_add(1, count_order());
    return true;
  }

  // The finisher: for each split block's part 0, parts 1 .. parts-1 into pre in
  // order; each published block counted; each norm op's share at its place in op
  // order (after the CTA's last unit where no op reads it); then the CTA's final
  // barrier and the last CTA's reset.
  void finisher(int c, Cta& cta) {
    std::mt19937 rng(seed_ * 7919u + static_cast<unsigned>(run_ * 131 + c * 2 + 1));
    const uint32_t epoch = protocol::publish_epoch(runs_.load());
    int pre_given = 0, counted_blocks = 0, next_norm = 0, prologues = 0;
    bool ok = true;
    // A norm no op reads runs after the CTA's last unit (OpDesc::deferred).
    auto deferred = [&](int o) { return !read_by_an_op(o); };
    auto norms_before = [&](int op) {
      for (; ok && next_norm < op; ++next_norm)
        if (chain_.shapes[static_cast<std::size_t>(next_norm)].norm && !folded(next_norm) && !deferred(next_norm))
          ok = norm_share(c, next_norm, epoch, cta, pre_given, rng);
    };
    for (int i = plan_.cta_begin[c]; i < plan_.cta_begin[c + 1] && !timed_out_.load(); ++i) {
      const Unit& u = plan_.units[static_cast<std::size_t>(i)];
      norms_before(u.op);
      if (!ok) break;
      const bool first_of_op = i == plan_.cta_begin[c] || plan_.units[static_cast<std::size_t>(i - 1)].op != u.op;
      if (first_of_op && folds_.scale_from[static_cast<std::size_t>(u.op)] >= 0 &&
          !prologue(u.op, epoch, cta, prologues++, rng))
        break;
      if (protocol::finisher_sums(u)) {
        if (!wait_until([&] { return cta.pre_empty.load(std::memory_order_acquire) >= pre_given; }, rng)) break;
        for (int t = 0; t < m_; ++t)
          for (int r = 0; r < kBlockRows; ++r) {
            int64_t sum = 0;
            for (int p = 1; p < u.parts; ++p) {
              auto& slot = scratch_[static_cast<std::size_t>(protocol::part_element(u.scratch, p, m_, t, r))];
              int64_t v = kEmpty;
              if (!wait_until([&] { return (v = slot.load(std::memory_order_relaxed)) != kEmpty; }, rng)) break;
              sum = p == 1 ? v : sum + v;
              slot.store(kEmpty, std::memory_order_relaxed);  // for the next run
            }
            cta.pre[static_cast<std::size_t>(t * kBlockRows + r)] = sum;
          }
        jitter(rng);
        cta.pre_full.store(++pre_given, std::memory_order_release);
      }
      if (protocol::counted(u, read_by_an_op(u.op))) {
        ++counted_blocks;
        if (!wait_until([&] { return cta.pub_full.load(std::memory_order_acquire) >= counted_blocks; }, rng)) break;
        jitter(rng);
        if (!(bug_ == Bug::kCountNotAdvanced && u.op == 0))
          op_done_[static_cast<std::size_t>(u.op)].fetch_add(1, count_order());
        cta.pub_empty.store(counted_blocks, std::memory_order_release);
      }
    }
    if (!timed_out_.load()) norms_before(ops());
    for (int o = 0; ok && o < ops() && !timed_out_.load(); ++o)
      if (chain_.shapes[static_cast<std::size_t>(o)].norm && !folded(o) && deferred(o))
        ok = norm_share(c, o, epoch, cta, pre_given, rng);
    wait_until([&] { return cta.consumer_done.load(std::memory_order_acquire) != 0; }, rng);
    const uint32_t before = ctas_done_.fetch_add(1, std::memory_order_acq_rel);
    if (protocol::last_to_finish(before, static_cast<uint32_t>(ctas_))) {
      counts_completed_ = true;
      for (int o = 0; o < ops(); ++o)
        if (read_by_an_op(o) &&
            !protocol::complete(op_done_[static_cast<std::size_t>(o)].load(), plan_.blocks[static_cast<std::size_t>(o)]))
          counts_completed_ = false;
      for (auto& d : op_done_) d.store(0, std::memory_order_relaxed);
      ctas_done_.store(0, std::memory_order_relaxed);
      if (bug_ != Bug::kStaleEpoch) runs_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  Chain chain_;
  int m_;
  bool relaxed_;  // counts relaxed and copies checked (protocol::relaxed_counts), else released
  int ctas_;
  Bug bug_;
  unsigned seed_;
  std::vector<int64_t> window_;  // per op, its x's first column in the producer's out (the program's)
  Folds folds_;
  Plan plan_;
  MailboxLayout layout_;
  std::vector<std::atomic<int64_t>> mailbox_;
  std::vector<std::atomic<int64_t>> scratch_;
  std::vector<std::atomic<uint32_t>> op_done_;
  std::vector<std::vector<int64_t>> out_;  // per op, [m, n]
  std::atomic<uint32_t> ctas_done_{0};
  std::atomic<uint32_t> runs_{0};
  std::atomic<bool> timed_out_{false};
  std::atomic<int> unpublished_reads_{0};
  bool counts_completed_ = false;
  int run_ = 0;
};

// Runs 0 .. runs-1 and names the first check that fails ("" when none does).
std::string first_failure(Model& model, int runs) {
  for (int r = 0; r < runs; ++r) {
    model.run(r);
    const std::string run = " (run " + std::to_string(r) + ")";
    if (model.timed_out()) return "a wait hung" + run;
    if (model.unpublished_reads() > 0) return "a copy read an unpublished value" + run;
    for (int o = 0; o < model.ops(); ++o)
      if (!model.folded(o) && model.out(o) != model.reference(o)) return "op " + std::to_string(o) + "'s outputs" + run;
    if (!model.counts_completed()) return "a count short at the end" + run;
    if (!model.counters_reset()) return "counters not reset" + run;
    if (!model.scratch_empty()) return "scratch not emptied" + run;
    if (model.runs() != static_cast<uint32_t>(r + 1)) return "the run counter not advanced" + run;
    if (!model.next_epoch_empty()) return "the next epoch not empty" + run;
  }
  return "";
}

TEST(ProgramProtocol, ChainsRunCorrectlyBackToBack) {
  ASSERT_TRUE(protocol::relaxed_counts(protocol::kRelaxedCountRows) && !protocol::relaxed_counts(kReleasedRows))
      << "both forms run";
  for (int m : {1, protocol::kRelaxedCountRows, kReleasedRows})  // relaxed, relaxed at the bound, released
    for (int ctas : {7, 12})
      for (unsigned seed : {1u, 2u}) {
        SCOPED_TRACE(testing::Message() << "m " << m << ", " << ctas << " CTAs, seed " << seed);
        Model model(test_chain(), m, ctas, Bug::kNone, seed);
        int split = 0;
        for (const Unit& u : model.plan().units) split += u.parts > 1 ? 1 : 0;
        EXPECT_GT(split, 0) << "the chain should split blocks across CTAs";
        EXPECT_EQ(first_failure(model, 5), "");
      }
}

// Each planted bug fails, by the check that names it.
TEST(ProgramProtocol, PlantedBugsFail) {
  const std::vector<std::pair<Bug, std::string>> bugs = {
      {Bug::kMissingWait, "a copy read an unpublished value"},
      {Bug::kWaitOnLaterOp, "a wait hung"},
      {Bug::kCountNotAdvanced, "a count short at the end"},
      {Bug::kStaleEpoch, "the run counter not advanced"},
      {Bug::kNormStatsUnpolled, "a copy read an unpublished value"},
      {Bug::kFoldSumsUnpolled, "a copy read an unpublished value"}};
  for (int m : {1, kReleasedRows})  // relaxed counts and checked copies, released counts
    for (const auto& [bug, symptom] : bugs) {
      Model model(test_chain(), m, 12, bug, 3);
      const std::string failure = first_failure(model, 4);
      EXPECT_EQ(failure.substr(0, symptom.size()), symptom)
          << "m " << m << ", bug " << static_cast<int>(bug) << ": " << failure;
    }
}

// Where the loaders store x in a stage (protocol::x_piece_offset), for the kernels'
// (tokens, depth): the 128-byte swizzle of the tensor-map copies and wgmma's
// descriptors (address bits 4-6 XOR bits 7-9; a chunk is whole 1024-byte atoms), a
// permutation of the stage's 16-byte slots.
TEST(ProgramProtocol, LoadersStoreXInTheSwizzleWgmmaReads) {
  for (const auto [tokens, depth] : {std::pair{8, 4}, std::pair{16, 2}, std::pair{32, 2}, std::pair{64, 2}}) {
    const int chunk_bytes = tokens * 128;
    std::vector<int> slot_uses(depth * tokens * 8, 0);
    for (int chunk = 0; chunk < depth; ++chunk)
      for (int token = 0; token < tokens; ++token)
        for (int piece = 0; piece < 8; ++piece) {
          const int offset = protocol::x_piece_offset(chunk_bytes, chunk, token, piece);
          const int linear = chunk * chunk_bytes + token * 128 + piece * 16;
          ASSERT_EQ(offset, linear ^ (((linear >> 7) & 7) << 4)) << tokens << " " << chunk << " " << token;
          ++slot_uses[offset / 16];
        }
    for (int uses : slot_uses) ASSERT_EQ(uses, 1) << tokens;
  }
}

// The checked copy's walk (ActivationLoader::check_copy, protocol::copy_piece) over
// the kernels' (tokens, depth) at every row count: the lanes' pieces at real tokens
// are each piece of the m rows exactly once, and none lies past the stage's x.
TEST(ProgramProtocol, ACheckedCopyWalksEachRealPieceOnce) {
  for (const auto [tokens, depth] : {std::pair{8, 4}, std::pair{16, 2}, std::pair{32, 2}, std::pair{64, 2}}) {
    const int per_lane = depth * protocol::copy_rows_per_lane(tokens);
    ASSERT_LE(per_lane, 32) << tokens;
    for (int m = 1; m <= tokens; ++m) {
      std::vector<int> seen(depth * m * 8, 0);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < per_lane; ++i) {
          const protocol::CopyPiece c = protocol::copy_piece(tokens, lane, i);
          ASSERT_LT(c.chunk, depth);
          ASSERT_LT(c.token, tokens);
          ASSERT_LT(c.piece, 8);
          if (c.token < m) ++seen[(c.chunk * m + c.token) * 8 + c.piece];
        }
      for (int n : seen) ASSERT_EQ(n, 1) << "tokens " << tokens << ", m " << m;
    }
  }
}

}  // namespace
}  // namespace tpdecode::program
