#include "ddp/plot/bench.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "ddp/core/error.hpp"   // DDP_CHECK
#include "ddp/plot/jsonl.hpp"   // for_each_record, number_at

namespace ddp::plot {

namespace {

size_t index_of(std::vector<std::string>& names, const std::string& name) {
  const auto it = std::find(names.begin(), names.end(), name);
  if (it != names.end()) return size_t(it - names.begin());
  names.push_back(name);
  return names.size() - 1;
}

}  // namespace

BenchTable read_bench(const std::string& path) {
  BenchTable table;
  table.path = path;
  // (model index, np) -> rates by system index
  std::map<std::pair<size_t, int>, std::map<size_t, double>> rows;
  for_each_record(path, [&](const Json& record, const Where& where) {
    std::string model;
    if (const auto m = record.find("model"); m != record.end()) {
      DDP_CHECK(m->is_string(), where.str(), ": \"model\" is ", m->dump(), ", not a string");
      model = m->get<std::string>();
    }
    const int np = positive_int_at(record, "np", where);
    const auto rates = record.find("samples_per_sec");
    DDP_CHECK(rates != record.end(), where.str(), ": no \"samples_per_sec\" in this record");
    DDP_CHECK(rates->is_object() && !rates->empty(), where.str(),
              ": \"samples_per_sec\" must map each system to its rate, e.g. {\"ddp_train\": 10166.0}, got ",
              rates->dump());
    std::map<size_t, double> row;
    for (const auto& [system, value] : rates->items()) {
      DDP_CHECK(value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() >= 0, where.str(),
                ": \"samples_per_sec\" of \"", system, "\" is ", value.dump(), ", not a rate (a number >= 0)");
      row[index_of(table.systems, system)] = value.get<double>();
    }
    rows[{index_of(table.models, model), np}] = std::move(row);
  });
  DDP_CHECK(!rows.empty(), path, ": no records (is it a file of bench/compare_pytorch.sh's DDP_BENCH_JSON?)");
  for (const auto& [key, rates] : rows) {
    BenchRow row{table.models[key.first], key.second, std::vector<std::optional<double>>(table.systems.size())};
    for (const auto& [system, v] : rates) row.rate[system] = v;
    table.rows.push_back(std::move(row));
  }
  return table;
}

}  // namespace ddp::plot
