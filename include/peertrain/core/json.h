// A small JSON writer for the files and reports peertrain emits (summary.json, inspect
// --format json). Keys keep their insertion order so output diffs cleanly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace peertrain::json {

class Object {
 public:
  Object& add(std::string_view key, double value);
  Object& add(std::string_view key, long long value);
  Object& add(std::string_view key, int value) { return add(key, static_cast<long long>(value)); }
  Object& add(std::string_view key, std::size_t value) { return add(key, static_cast<long long>(value)); }
  Object& add(std::string_view key, bool value);
  Object& add(std::string_view key, std::string_view value);
  Object& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  Object& add(std::string_view key, const Object& value);
  Object& add_null(std::string_view key);
  Object& add_raw(std::string_view key, std::string raw_json);  // e.g. an array built elsewhere

  std::string dump(int indent = 2) const;

 private:
  std::vector<std::pair<std::string, std::string>> members_;  // key, serialized value
};

std::string quote(std::string_view text);
std::string number(double value);  // non-finite values become null
std::string array(const std::vector<double>& values);
std::string array(const std::vector<int>& values);

}  // namespace peertrain::json
