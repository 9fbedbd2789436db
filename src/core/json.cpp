#include "peertrain/core/json.h"

#include <cmath>
#include <cstdio>

namespace peertrain::json {

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

std::string array(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + number(values[i]);
  return out + "]";
}

std::string array(const std::vector<int>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

Object& Object::add(std::string_view key, double value) {
  members_.emplace_back(std::string(key), number(value));
  return *this;
}
Object& Object::add(std::string_view key, long long value) {
  members_.emplace_back(std::string(key), std::to_string(value));
  return *this;
}
Object& Object::add(std::string_view key, bool value) {
  members_.emplace_back(std::string(key), value ? "true" : "false");
  return *this;
}
Object& Object::add(std::string_view key, std::string_view value) {
  members_.emplace_back(std::string(key), quote(value));
  return *this;
}
Object& Object::add(std::string_view key, const Object& value) {
  members_.emplace_back(std::string(key), value.dump(0));
  return *this;
}
Object& Object::add_null(std::string_view key) {
  members_.emplace_back(std::string(key), "null");
  return *this;
}
Object& Object::add_raw(std::string_view key, std::string raw_json) {
  members_.emplace_back(std::string(key), std::move(raw_json));
  return *this;
}

std::string Object::dump(int indent) const {
  if (members_.empty()) return "{}";
  const std::string pad(indent, ' ');
  const char* newline = indent > 0 ? "\n" : "";
  std::string out = "{";
  out += newline;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    out += pad + quote(members_[i].first) + (indent > 0 ? ": " : ":") + members_[i].second;
    if (i + 1 < members_.size()) out += indent > 0 ? "," : ", ";
    out += newline;
  }
  return out + "}";
}

}  // namespace peertrain::json
