#include "ddp/plot/jsonl.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "ddp/core/error.hpp"  // DDP_CHECK, DDP_FAIL

namespace ddp::plot {

void for_each_record(const std::string& path, const std::function<void(const Json&, const Where&)>& visit) {
  std::ifstream in(path);
  DDP_CHECK(in, path, ": cannot open: ", std::strerror(errno));
  std::string text;
  Where where{path, 0};
  while (std::getline(in, text)) {
    ++where.line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json record;
    try {
      record = Json::parse(text);
    } catch (const Json::parse_error& e) {
      // nlohmann's message starts "[json.exception.parse_error.101] parse error at
      // line 1, column N: ...": keep the part after the column.
      std::string why = e.what();
      if (const auto at = why.find(": ", why.find("column")); at != std::string::npos) why = why.substr(at + 2);
      DDP_FAIL(where.str(), ": not a JSON line (", why, ")");
    }
    DDP_CHECK(record.is_object(), where.str(), ": expected a JSON object, got ", record.type_name());
    visit(record, where);
  }
  DDP_CHECK(in.eof(), path, ": read error: ", std::strerror(errno));
}

double number_at(const Json& record, const char* key, const Where& where) {
  const auto it = record.find(key);
  DDP_CHECK(it != record.end(), where.str(), ": no \"", key, "\" in this record");
  DDP_CHECK(it->is_number(), where.str(), ": \"", key, "\" is ", it->dump(), ", not a number");
  const double v = it->get<double>();
  DDP_CHECK(std::isfinite(v), where.str(), ": \"", key, "\" is ", it->dump(), ", not finite");
  return v;
}

int positive_int_at(const Json& record, const char* key, const Where& where) {
  const double v = number_at(record, key, where);
  DDP_CHECK(v >= 1 && v <= 1e9 && v == std::floor(v), where.str(), ": \"", key, "\" is ",
            record.at(key).dump(), ", not a whole number >= 1");
  return static_cast<int>(v);
}

}  // namespace ddp::plot
