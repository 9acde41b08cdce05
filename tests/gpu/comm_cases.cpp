#include "gpu/comm_cases.hpp"

#include "core/bf16.hpp"
#include "reference/all_reduce.hpp"
#include "reference/gather.hpp"

namespace tpdecode::test {

namespace {

void plant_sentinels(std::vector<uint16_t>& v, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> pick(0, v.size() / 2 - 1);
  for (int n = 0; n < 3; ++n) {
    const std::size_t w = pick(rng);
    v[2 * w] = 0x0000;
    v[2 * w + 1] = 0x8000;
  }
}

std::size_t elems(int rows, int64_t cols) { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }

}  // namespace

std::vector<cudaStream_t> team_streams(const Team& team) {
  std::vector<cudaStream_t> s;
  for (int i = 0; i < team.driven(); ++i) s.push_back(team.stream(i));
  return s;
}

MismatchCount::MismatchCount(const Team& team) : streams_(team_streams(team)), counter_(sizeof(unsigned)) { reset(); }

void MismatchCount::check(const std::vector<DeviceBuffer>& got, const DeviceBuffer& want, std::size_t n) {
  for (std::size_t i = 0; i < streams_.size(); ++i)
    count_mismatches(got[i].get(), want.get(), n, counter_.as<unsigned>(), streams_[i]);
}

unsigned MismatchCount::read() const { return to_host<unsigned>(counter_, 1)[0]; }

void MismatchCount::reset() { TPD_CUDA(cudaMemset(counter_.get(), 0, sizeof(unsigned))); }

std::vector<std::vector<uint16_t>> make_partials(int ranks, int rows, int64_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint16_t>> p;
  for (int r = 0; r < ranks; ++r) {
    p.push_back(random_bf16(elems(rows, width), rng));
    plant_sentinels(p.back(), rng);
  }
  if (ranks >= 4) {
    const float planted[4] = {16777216.0f, 1.0f, -16777216.0f, 1.0f};
    const auto column = static_cast<std::size_t>(rng() % static_cast<uint64_t>(width));
    for (int r = 0; r < ranks; ++r) p[static_cast<std::size_t>(r)][column] = bf16::from_float(r < 4 ? planted[r] : 0.0f);
  }
  return p;
}

AllReduceCase::AllReduceCase(const Team& team, int rows_, int64_t width_, uint64_t seed) : rows(rows_), width(width_) {
  for (int i = 0; i < team.driven(); ++i) {
    x.emplace_back(elems(rows, width) * 2);
    out.emplace_back(elems(rows, width) * 2);
    io.push_back({TensorView::bf16(x.back().get(), rows, width), TensorView::bf16(out.back().get(), rows, width)});
  }
  refill(team, seed);
}

void AllReduceCase::refill(const Team& team, uint64_t seed) {
  partials = make_partials(team.size(), rows, width, seed);
  reference = reference::all_reduce(partials);
  for (int i = 0; i < team.driven(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    upload(x[k], partials[static_cast<std::size_t>(team.rank(i))].data(), elems(rows, width) * 2);
    poison(out[k]);
  }
  TPD_CUDA(cudaDeviceSynchronize());
}

int AllReduceCase::ranks_wrong(const Team& team) const {
  int wrong = 0;
  for (int i = 0; i < team.driven(); ++i)
    wrong += to_host<uint16_t>(out[static_cast<std::size_t>(i)], reference.size()) != reference;
  return wrong;
}

ArNormCase::ArNormCase(const Team& team, int rows_, int64_t hidden_, bool residual_, uint64_t seed)
    : rows(rows_), hidden(hidden_), has_residual(residual_) {
  std::mt19937_64 rng(seed ^ 0x5eedull);
  partials = make_partials(team.size(), rows, hidden, seed);
  if (has_residual) residual = random_bf16(elems(rows, hidden), rng, 4.0f);
  weight = random_bf16(static_cast<std::size_t>(hidden), rng, 0.5f);
  reference = reference::ar_norm(partials, residual, weight, 1e-6f, hidden);
  weight_dev = to_device(weight);
  for (int i = 0; i < team.driven(); ++i) {
    x.push_back(to_device(partials[static_cast<std::size_t>(team.rank(i))]));
    res.push_back(has_residual ? to_device(residual) : DeviceBuffer(16));
    out.emplace_back(elems(rows, hidden) * 2);
    res_out.emplace_back(elems(rows, hidden) * 2);
    poison(out.back());
    poison(res_out.back());
    ArNormIo a;
    a.x = TensorView::bf16(x.back().get(), rows, hidden);
    if (has_residual) a.residual = TensorView::bf16(res.back().get(), rows, hidden);
    a.weight = TensorView::bf16(weight_dev.get(), 1, hidden);
    a.out = TensorView::bf16(out.back().get(), rows, hidden);
    a.residual_out = TensorView::bf16(res_out.back().get(), rows, hidden);
    io.push_back(a);
  }
  TPD_CUDA(cudaDeviceSynchronize());
}

int ArNormCase::ranks_wrong(const Team& team) const {
  const std::size_t n = reference.out.size();
  int wrong = 0;
  for (int i = 0; i < team.driven(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    const std::vector<uint16_t> got_res = to_host<uint16_t>(res_out[k], n);
    const std::vector<uint16_t> got_out = to_host<uint16_t>(out[k], n);
    bool ok = got_res == reference.residual_out;
    for (std::size_t e = 0; ok && e < n; ++e) ok = bf16::ulp_distance(got_out[e], reference.out[e]) <= 1;
    wrong += !ok;
  }
  return wrong;
}

GatherCase::GatherCase(const Team& team, int rows_, int64_t shard_cols_, DType dtype_, uint64_t seed)
    : rows(rows_), shard_cols(shard_cols_), dtype(dtype_) {
  std::mt19937_64 rng(seed);
  const int64_t words = shard_cols * static_cast<int64_t>(dtype_size(dtype)) / 4;
  for (int r = 0; r < team.size(); ++r) {
    std::vector<uint32_t> v(elems(rows, words));
    for (auto& w : v) w = static_cast<uint32_t>(rng());
    for (int k = 0; k < 3; ++k) v[rng() % v.size()] = 0x80000000u;  // sentinel words: INT_MIN, F32 -0, BF16 (+0, -0)
    shards.push_back(std::move(v));
  }
  reference = reference::gather(shards, rows, words);
  for (int i = 0; i < team.driven(); ++i) {
    shard.push_back(to_device(shards[static_cast<std::size_t>(team.rank(i))]));
    out.emplace_back(elems(rows, words) * 4 * static_cast<std::size_t>(team.size()));
    poison(out.back());
    io.push_back({TensorView{shard.back().get(), dtype, rows, shard_cols, shard_cols},
                  TensorView{out.back().get(), dtype, rows, shard_cols * team.size(), shard_cols * team.size()}});
  }
  TPD_CUDA(cudaDeviceSynchronize());
}

int GatherCase::ranks_wrong(const Team& team, bool cleaned) const {
  std::vector<uint32_t> want = reference;  // the reference cleans sentinel words
  if (!cleaned) {
    const int64_t words = shard_cols * static_cast<int64_t>(dtype_size(dtype)) / 4;
    for (int r = 0; r < team.size(); ++r)
      for (int row = 0; row < rows; ++row)
        for (int64_t w = 0; w < words; ++w)
          want[static_cast<std::size_t>((row * team.size() + r) * words + w)] =
              shards[static_cast<std::size_t>(r)][static_cast<std::size_t>(row * words + w)];
  }
  int wrong = 0;
  for (int i = 0; i < team.driven(); ++i) wrong += to_host<uint32_t>(out[static_cast<std::size_t>(i)], want.size()) != want;
  return wrong;
}

bool all_nan(const DeviceBuffer& d, std::size_t n) {
  for (uint16_t v : to_host<uint16_t>(d, n))
    if ((v & 0x7f80) != 0x7f80 || (v & 0x7f) == 0) return false;
  return true;
}

}  // namespace tpdecode::test
