// Trace (core/trace.hpp): Chrome trace-event JSON, "X" (complete) events.
#include "ddp/core/trace.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ddp/core/error.hpp"

namespace ddp {

Trace::Trace(int rank, std::string host, int64_t first, int64_t last, Clock::time_point origin)
    : rank_(rank), host_(std::move(host)), first_(first), last_(last), origin_(origin) {}

void Trace::span(int track, const char* category, std::string name, Clock::time_point t0, Clock::time_point t1,
                 Args args) {
  if (active_) record(track, category, std::move(name), t0, t1, std::move(args));
}

void Trace::device_span(uint32_t stream, const char* category, std::string name, Clock::time_point t0,
                        Clock::time_point t1, Args args) {
  record(kFirstGpuStream + int(stream % 1000000u), category, std::move(name), t0, t1, std::move(args));
}

void Trace::record(int track, const char* category, std::string name, Clock::time_point t0, Clock::time_point t1,
                   Args args) {
  const auto ns = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  };
  const int64_t begin = ns(t0), end = ns(t1);
  events_.push_back({track, category, std::move(name), begin, std::max<int64_t>(0, end - begin), std::move(args)});
}

std::string Trace::json() const {
  using json = nlohmann::ordered_json;
  json events = json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", detail::concat("rank ", rank_, " (", host_, ")")}}}});
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
  std::map<int, std::string> tracks;
  for (const Event& e : events_)
    tracks.emplace(e.track, e.track >= kFirstGpuStream ? detail::concat("GPU stream ", e.track - kFirstGpuStream)
                            : e.track >= kFirstBucket  ? detail::concat("all-reduce, bucket ", e.track - kFirstBucket)
                                                       : std::string("step"));
  for (const auto& [tid, name] : tracks) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args", {{"name", name}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
  }
  for (const Event& e : events_) {
    json args = json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    // Microseconds, as the format wants, kept to the nanosecond.
    events.push_back({{"name", e.name},
                      {"cat", e.category},
                      {"ph", "X"},
                      {"pid", rank_},
                      {"tid", e.track},
                      {"ts", double(e.ts_ns) / 1000.0},
                      {"dur", double(e.dur_ns) / 1000.0},
                      {"args", std::move(args)}});
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

void Trace::write(const std::string& path) {
  written_ = true;
  std::ofstream f(path, std::ios::trunc);
  DDP_CHECK(f, path, ": cannot open for writing (--trace): ", std::strerror(errno));
  f << json() << "\n";
  f.close();
  DDP_CHECK(f, path, ": write failed (--trace): ", std::strerror(errno));
}

std::string trace_path_for_rank(const std::string& path, int rank) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const std::string tag = detail::concat(".rank", rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1)
    return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

}  // namespace ddp
