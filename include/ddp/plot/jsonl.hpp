// Reading JSON Lines files (one object a line) with every error naming the
// file and line: shared by the metrics and the benchmark readers.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace ddp::plot {

// Keys keep the file's order, so a benchmark's systems are drawn in the order
// the benchmark wrote them.
using Json = nlohmann::ordered_json;

// Where a record came from: "FILE:LINE", the prefix of every error about it.
struct Where {
  std::string file;
  int line = 0;
  std::string str() const { return file + ":" + std::to_string(line); }
};

// Calls visit(record, where) for each non-blank line of path, in order. Throws
// ddp::Error naming the file (it cannot be opened or read) or the file and line
// (not JSON, not an object); exceptions from visit pass through.
void for_each_record(const std::string& path, const std::function<void(const Json&, const Where&)>& visit);

// record[key] as a finite number; an error naming where and key when it is
// missing, not a number (JSON's null stands for NaN) or not finite.
double number_at(const Json& record, const char* key, const Where& where);

// record[key] as an integer >= 1 (epochs, world sizes).
int positive_int_at(const Json& record, const char* key, const Where& where);

}  // namespace ddp::plot
