#include "peertrain/topology/formats.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "peertrain/topology/topology.h"
#include "peertrain/core/error.h"

namespace peertrain::topology {
namespace {

[[noreturn]] void parse_error(const std::string& origin, int line, const std::string& message) {
  throw Error(ErrorKind::kParse, str(origin, ":", line, ": ", message));
}

// Splits a line into whitespace-separated fields without allocating per field.
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == ',')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r' && line[j] != ',') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

long long to_integer(std::string_view field, const std::string& origin, int line, const char* what) {
  long long value = 0;
  auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc() || ptr != field.data() + field.size())
    parse_error(origin, line, str("expected an integer ", what, ", got '", field, "'"));
  return value;
}

double to_real(std::string_view field, const std::string& origin, int line) {
  double value = 0;
  auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc() || ptr != field.data() + field.size())
    parse_error(origin, line, str("expected a number, got '", field, "'"));
  return value;
}

int checked_peer(long long id, const std::string& origin, int line) {
  if (id < 0 || id >= kMaxPeers)
    parse_error(origin, line, str("peer id ", id, " is out of range 0..", kMaxPeers - 1));
  return static_cast<int>(id);
}

template <typename Fn>
void for_each_line(const std::string& text, Fn&& fn) {
  std::size_t start = 0;
  int number = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++number;
    if (!fn(std::string_view(text).substr(start, end - start), number)) return;
    start = end + 1;
  }
}

}  // namespace

std::string read_text_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(ErrorKind::kIo, str(path, ": cannot read ", what, ": it is a directory"));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorKind::kIo, str(path, ": cannot read ", what, ": ", std::strerror(errno)));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (in.bad()) throw Error(ErrorKind::kIo, str(path, ": error while reading ", what));
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw Error(ErrorKind::kParse, str(path, ": the ", what, " is empty"));
  if (auto nul = text.find('\0'); nul != std::string::npos)
    throw Error(ErrorKind::kParse, str(path, ": the ", what, " looks binary (NUL byte at offset ", nul,
                                       "); expected a text file"));
  return text;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::kIo, str(path, ": cannot write: ", std::strerror(errno)));
  out << text;
  out.flush();
  if (!out) throw Error(ErrorKind::kIo, str(path, ": error while writing"));
}

Graph EdgeListData::to_graph(const std::string& origin, int n_override) const {
  int peers = n;
  if (n_override > 0) {
    if (n_override < n)
      throw Error(ErrorKind::kInvalidArgument,
                  str(origin, ": n = ", n_override, " but the file names peer ", n - 1));
    peers = n_override;
  }
  return Graph::from_edges(peers, edges, origin,
                           [this](std::size_t k) { return str("line ", lines[k]); });
}

EdgeListData parse_edge_list(const std::string& text, const std::string& origin) {
  EdgeListData data;
  for_each_line(text, [&](std::string_view line, int number) {
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    auto fields = fields_of(line);
    if (fields.empty()) return true;
    if (fields.size() != 2)
      parse_error(origin, number, str("expected two peer ids 'u v', got ", fields.size(), " fields"));
    const int u = checked_peer(to_integer(fields[0], origin, number, "peer id"), origin, number);
    const int v = checked_peer(to_integer(fields[1], origin, number, "peer id"), origin, number);
    data.edges.push_back({u, v});
    data.lines.push_back(number);
    data.values.push_back(1.0);
    data.n = std::max({data.n, u + 1, v + 1});
    return true;
  });
  if (data.n == 0) throw Error(ErrorKind::kParse, str(origin, ": no edges and no peers in the edge list"));
  return data;
}

EdgeListData parse_matrix_market(const std::string& text, const std::string& origin) {
  EdgeListData data;
  bool banner = false, sized = false, symmetric = false, pattern = false;
  long long declared = 0, seen = 0;
  std::unordered_set<std::uint64_t> ordered_pairs;
  for_each_line(text, [&](std::string_view line, int number) {
    if (!banner) {
      auto fields = fields_of(line);
      if (fields.size() != 5 || fields[0] != "%%MatrixMarket" || fields[1] != "matrix" || fields[2] != "coordinate")
        parse_error(origin, number, "expected the banner '%%MatrixMarket matrix coordinate <field> <symmetry>'");
      if (fields[3] != "real" && fields[3] != "integer" && fields[3] != "pattern")
        parse_error(origin, number, str("unsupported field '", fields[3], "'; expected real, integer or pattern"));
      if (fields[4] != "symmetric" && fields[4] != "general")
        parse_error(origin, number, str("unsupported symmetry '", fields[4], "'; expected symmetric or general"));
      pattern = fields[3] == "pattern";
      symmetric = fields[4] == "symmetric";
      banner = true;
      return true;
    }
    if (!line.empty() && line[0] == '%') return true;
    auto fields = fields_of(line);
    if (fields.empty()) return true;
    if (!sized) {
      if (fields.size() != 3) parse_error(origin, number, "expected the size line 'rows cols entries'");
      const long long rows = to_integer(fields[0], origin, number, "row count");
      const long long cols = to_integer(fields[1], origin, number, "column count");
      declared = to_integer(fields[2], origin, number, "entry count");
      if (rows != cols) parse_error(origin, number, str("the matrix is ", rows, "x", cols, "; expected square"));
      if (rows < 1 || rows > kMaxPeers) parse_error(origin, number, str("size ", rows, " is out of range 1..", kMaxPeers));
      if (declared < 0) parse_error(origin, number, "negative entry count");
      data.n = static_cast<int>(rows);
      sized = true;
      return true;
    }
    const std::size_t want = pattern ? 2 : 3;
    if (fields.size() != want)
      parse_error(origin, number, str("expected ", want, " fields per entry, got ", fields.size()));
    const long long i = to_integer(fields[0], origin, number, "row index");
    const long long j = to_integer(fields[1], origin, number, "column index");
    if (i < 1 || i > data.n || j < 1 || j > data.n)
      parse_error(origin, number, str("entry (", i, ", ", j, ") is outside the ", data.n, "x", data.n, " matrix"));
    const double value = pattern ? 1.0 : to_real(fields[2], origin, number);
    if (!std::isfinite(value)) parse_error(origin, number, str("entry (", i, ", ", j, ") is not finite"));
    if (++seen > declared)
      parse_error(origin, number, str("more entries than the ", declared, " the size line declares"));
    const auto key = (static_cast<std::uint64_t>(i) << 32) | static_cast<std::uint64_t>(j);
    if (!ordered_pairs.insert(key).second)
      parse_error(origin, number, str("entry (", i, ", ", j, ") is given twice"));
    if (i == j) {
      if (data.diagonal.empty()) data.diagonal.assign(data.n, 0.0);
      data.diagonal[i - 1] = value;
      return true;
    }
    // A general file lists both halves of a symmetric matrix; keep one edge per pair.
    if (!symmetric && ordered_pairs.count((static_cast<std::uint64_t>(j) << 32) | static_cast<std::uint64_t>(i)))
      return true;
    if (value == 0.0) return true;
    data.edges.push_back({static_cast<int>(i - 1), static_cast<int>(j - 1)});
    data.lines.push_back(number);
    data.values.push_back(value);
    return true;
  });
  if (!banner) throw Error(ErrorKind::kParse, str(origin, ": empty Matrix Market file"));
  if (!sized) throw Error(ErrorKind::kParse, str(origin, ": missing the size line 'rows cols entries'"));
  if (seen != declared)
    throw Error(ErrorKind::kParse, str(origin, ": the size line declares ", declared, " entries but the file has ", seen));
  return data;
}

EdgeListData read_graph_file(const std::string& path) {
  const std::string text = read_text_file(path, "graph file");
  if (text.rfind("%%MatrixMarket", 0) == 0) return parse_matrix_market(text, path);
  return parse_edge_list(text, path);
}

std::string to_matrix_market(const SparseMatrix& w, const std::string& comment, bool symmetric) {
  std::ostringstream out;
  out.precision(17);
  long long entries = 0;
  for (int j = 0; j < w.outerSize(); ++j)
    for (SparseMatrix::InnerIterator it(w, j); it; ++it)
      if (!symmetric || it.row() >= j) ++entries;
  out << "%%MatrixMarket matrix coordinate real " << (symmetric ? "symmetric" : "general") << "\n";
  if (!comment.empty()) out << "% " << comment << "\n";
  out << w.rows() << " " << w.cols() << " " << entries << "\n";
  for (int j = 0; j < w.outerSize(); ++j)
    for (SparseMatrix::InnerIterator it(w, j); it; ++it)
      if (!symmetric || it.row() >= j) out << it.row() + 1 << " " << j + 1 << " " << it.value() << "\n";
  return out.str();
}

std::string to_dot(const std::string& name, const Graph& graph, const SparseMatrix* w) {
  std::ostringstream out;
  out.precision(3);
  std::string id;
  for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (id.empty() || std::isdigit(static_cast<unsigned char>(id[0]))) id = "g_" + id;
  out << "graph " << id << " {\n  layout=" << (graph.num_peers() <= 64 ? "circo" : "sfdp")
      << ";\n  node [shape=circle, fontsize=10];\n";
  for (int i = 0; i < graph.num_peers(); ++i) {
    out << "  " << i;
    if (w) out << " [tooltip=\"self weight " << w->coeff(i, i) << "\"]";
    out << ";\n";
  }
  for (const Edge& e : graph.edges()) {
    out << "  " << e.u << " -- " << e.v;
    if (w) {
      const double weight = w->coeff(e.u, e.v);
      out << " [label=\"" << weight << "\", penwidth=" << 0.5 + 4.0 * weight << "]";
    }
    out << ";\n";
  }
  out << "}\n";
  return out.str();
}

}  // namespace peertrain::topology
