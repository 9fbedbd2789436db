// PipeDream's stage partitioning (Narayanan et al. 2019), reduced to what matters inside
// one peer: a min-max split of a chain by dynamic programming over the split points, fed
// by a measured cost of each unit.
#include "peertrain/parallel/partitioner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "peertrain/core/error.h"

namespace peertrain::parallel {

std::vector<int> partition(std::span<const double> unit_costs, int stages) {
  const int units = static_cast<int>(unit_costs.size());
  if (stages < 1 || stages > units)
    throw Error(ErrorKind::kInvalidArgument,
                str("pipeline partition: ", stages, " stages cannot split ", units,
                    " units so that every stage holds at least one (expected 1 ≤ stages ≤ units)"));
  for (int u = 0; u < units; ++u)
    if (!std::isfinite(unit_costs[u]) || unit_costs[u] < 0)
      throw Error(ErrorKind::kInvalidArgument,
                  str("pipeline partition: the cost of unit ", u, " is ", unit_costs[u],
                      ", expected finite and ≥ 0"));

  std::vector<double> prefix(units + 1, 0.0);
  for (int u = 0; u < units; ++u) prefix[u + 1] = prefix[u] + unit_costs[u];
  // best[k][j]: the smallest bottleneck of the first j units cut into k stages;
  // cut[k][j]: where the k-th stage starts in that split. O(stages · units²) is nothing
  // next to a profile for the chains a transformer has (tens of units).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(units + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(units + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int j = k; j <= units; ++j)
      for (int i = k - 1; i < j; ++i) {  // the k-th stage is units [i, j)
        const double value = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        // Strict: among equal bottlenecks keep the earliest cut.
        if (value < best[k][j]) {
          best[k][j] = value;
          cut[k][j] = i;
        }
      }
  std::vector<int> first(stages);
  for (int k = stages, j = units; k >= 1; --k) {
    first[k - 1] = cut[k][j];
    j = cut[k][j];
  }
  return first;
}

double bottleneck_cost(std::span<const double> unit_costs, std::span<const int> first_units) {
  const int units = static_cast<int>(unit_costs.size());
  validate_first_units(first_units, units, static_cast<int>(first_units.size()), "pipeline partition");
  double worst = 0;
  for (std::size_t k = 0; k < first_units.size(); ++k) {
    const int end = k + 1 < first_units.size() ? first_units[k + 1] : units;
    double sum = 0;
    for (int u = first_units[k]; u < end; ++u) sum += unit_costs[u];
    worst = std::max(worst, sum);
  }
  return worst;
}

void validate_first_units(std::span<const int> first_units, int units, int stages, std::string_view flag) {
  auto fail = [&](const std::string& what) {
    std::string given;
    for (std::size_t i = 0; i < first_units.size(); ++i) {
      if (i) given += ',';
      given += std::to_string(first_units[i]);
    }
    throw Error(ErrorKind::kInvalidArgument, str(flag, ": ", what, " (first units {", given, "}, expected ", stages,
                                                 " stages over ", units, " units)"));
  };
  if (static_cast<int>(first_units.size()) != stages)
    fail(str("expected the first unit of each of ", stages, " stages, got ", first_units.size()));
  if (stages < 1) fail("expected at least one stage");
  if (first_units[0] != 0) fail("the first stage must start at unit 0");
  for (int k = 1; k < stages; ++k)
    if (first_units[k] <= first_units[k - 1]) fail(str("stage ", k, " would be empty or out of order"));
  if (first_units[stages - 1] >= units) fail(str("the last stage would be empty"));
}

std::vector<int> parse_stage_sizes(std::string_view text, int units, int stages, std::string_view flag) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument,
                str(flag, " '", text, "': ", what, "; expected ", stages,
                    " positive unit counts separated by commas that sum to ", units,
                    " (the embedding, the blocks and the head)"));
  };
  std::vector<int> sizes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const bool digits = std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (item.empty() || item.size() > 9 || !digits)
      fail(str("'", item, "' is not a unit count"));
    const int size = std::stoi(std::string(item));
    if (size <= 0) fail("every stage needs at least one unit");
    sizes.push_back(size);
    start = comma + 1;
  }
  if (static_cast<int>(sizes.size()) != stages) fail(str(sizes.size(), " stages given"));
  long long total = 0;
  for (int size : sizes) total += size;
  if (total != units) fail(str("the counts sum to ", total));
  std::vector<int> first(stages);
  for (int k = 1; k < stages; ++k) first[k] = first[k - 1] + sizes[k - 1];
  return first;
}

std::string format_stage_sizes(std::span<const int> first_units, int units) {
  std::string text;
  for (std::size_t k = 0; k < first_units.size(); ++k) {
    const int end = k + 1 < first_units.size() ? first_units[k + 1] : units;
    if (k) text += ',';
    text += std::to_string(end - first_units[k]);
  }
  return text;
}

std::vector<double> profile_units(model::Transformer& model, std::span<const float> params,
                                  const model::TokenBatch& sample, int repetitions, const model::UnitContext& context) {
  PEERTRAIN_CHECK(repetitions >= 1, "repetitions ", repetitions);
  const int units = model.num_units();
  const std::size_t width = static_cast<std::size_t>(model.config().d_model) * sample.batch * sample.tokens;
  std::vector<model::UnitActivations> saved(units);
  // One more boundary than units, so unit u reads acts[u] and writes acts[u + 1].
  std::vector<std::vector<float>> acts(units + 1, std::vector<float>(width));
  std::vector<float> grad_a(width), grad_b(width);
  std::vector<float> grads(model.num_parameters(), 0.0f);
  std::vector<std::vector<double>> seconds(units);
  using Clock = std::chrono::steady_clock;
  for (int run = 0; run <= repetitions; ++run) {  // run 0 warms the buffers up
    for (int u = 0; u < units; ++u) {
      const auto start = Clock::now();
      model.forward(u, params, sample, acts[u].data(), acts[u + 1].data(), saved[u], context);
      if (run > 0) seconds[u].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    float* dout = grad_a.data();
    float* din = grad_b.data();
    for (int u = units - 1; u >= 0; --u) {
      const auto start = Clock::now();
      model.backward(u, params, sample, dout, din, saved[u], grads, context);
      if (run > 0) seconds[u].back() += std::chrono::duration<double>(Clock::now() - start).count();
      std::swap(dout, din);
    }
  }
  std::vector<double> median(units);
  for (int u = 0; u < units; ++u) {
    auto& s = seconds[u];
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    median[u] = s[s.size() / 2];
  }
  return median;
}

}  // namespace peertrain::parallel
